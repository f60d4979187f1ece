#!/usr/bin/env python3
"""Validates JSON texts against JSON Schemas, for the structured output tests.

stdin: a JSON list of {"schema": <schema>, "text": <string>}; stdout: a JSON
list of {"ok": bool, "error": <string or null>}, one per item: the text must
parse as JSON and validate (python3-jsonschema, the schema's draft, formats
checked)."""
import json
import sys

import jsonschema


def check(schema, text):
    try:
        value = json.loads(text)
    except ValueError as e:
        return {"ok": False, "error": f"not JSON: {e}"}
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
    except jsonschema.ValidationError as e:
        return {"ok": False, "error": e.message}
    return {"ok": True, "error": None}


items = json.load(sys.stdin)
json.dump([check(i["schema"], i["text"]) for i in items], sys.stdout)
