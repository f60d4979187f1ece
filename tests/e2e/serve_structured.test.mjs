// Structured output end to end (issue 38): response_format (json_object,
// json_schema), llama-server's json_schema, text.format on /v1/responses,
// forced tool calls and strict tools, streamed and not, many at once. Every
// reply that ends with "stop" must parse and validate against its schema
// (python3-jsonschema, validate_json.py); a reply cut by max_tokens ends
// with "length" and may not parse.
//
// The bundled model was never trained on JSON and wanders in the whitespace
// JSON allows between tokens; the requests bias its whitespace-only tokens
// away (logit_bias, as a client may), so that replies end in a few dozen
// tokens. The grammar, not the bias, is what makes them valid.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, ROOT, MODEL } from './harness.mjs';
import { withCopyModel } from './copy_model.mjs';

const here = path.join(ROOT, 'tests', 'e2e');

function validate(items) {
  const r = spawnSync('python3', [path.join(here, 'validate_json.py')], { input: JSON.stringify(items), encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

// logit_bias against the tokens that are only whitespace (byte-level BPE: Ġ space, Ċ newline, ĉ tab, č return)
const vocab = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8')).model.vocab;
const noSpace = Object.fromEntries(Object.entries(vocab).filter(([t]) => /^[ĠĊĉč]+$/.test(t)).map(([, id]) => [String(id), -100]));

const schemas = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 24 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      tags: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, maxItems: 3 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  nested: {
    type: 'object',
    properties: {
      id: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' },
      owner: {
        type: 'object',
        properties: { first: { type: 'string', maxLength: 12 }, level: { type: 'integer', minimum: 1, maximum: 5 } },
        required: ['first', 'level'],
        additionalProperties: false,
      },
      ok: { type: 'boolean' },
    },
    required: ['id', 'owner', 'ok'],
    additionalProperties: false,
  },
  list: { type: 'array', items: { type: 'integer', minimum: -50, maximum: 50 }, minItems: 1, maxItems: 4 },
  choice: { enum: ['yes', 'no', 'maybe'] },
};

let srv, client;
before(async () => {
  srv = await startServer(['--parallel', '8']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (srv) assert.equal((await srv.stop()).code, 0);
});

const base = (seed) => ({ model: 'fortune', max_tokens: 200, seed, temperature: 0.8, logit_bias: noSpace });

async function streamText(stream, pick) {
  let text = '', finish = null;
  for await (const c of stream) {
    text += pick(c) ?? '';
    finish = c.choices?.[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

// every "stop" reply valid; the test must have had some
function checkAll(results) {
  const stops = results.filter((r) => r.finish === 'stop');
  for (const r of results) assert.ok(['stop', 'length'].includes(r.finish), `finish ${r.finish}`);
  assert.ok(stops.length >= results.length / 2, `${stops.length} of ${results.length} replies ended with stop`);
  const v = validate(stops.map((r) => ({ schema: r.schema, text: r.text })));
  v.forEach((x, i) => assert.ok(x.ok, `${stops[i].what}: ${x.error}\n${stops[i].text}`));
}

test('json_schema on chat and completions, streamed and not, 16 at once: every stopped reply validates', async () => {
  const jobs = [];
  let seed = 1;
  for (const [name, schema] of Object.entries(schemas)) {
    const rf = { type: 'json_schema', json_schema: { name, schema, strict: true } };
    const messages = [{ role: 'user', content: `a fortune as ${name}` }];
    jobs.push(
      client.chat.completions.create({ ...base(seed++), messages, response_format: rf }).then((r) => ({
        what: `chat ${name}`, schema, text: r.choices[0].message.content, finish: r.choices[0].finish_reason })),
      client.chat.completions.create({ ...base(seed++), messages, response_format: rf, stream: true })
        .then((s) => streamText(s, (c) => c.choices?.[0]?.delta?.content)).then((r) => ({ what: `chat stream ${name}`, schema, ...r })),
      client.completions.create({ ...base(seed++), prompt: `A ${name}:`, response_format: rf }).then((r) => ({
        what: `completion ${name}`, schema, text: r.choices[0].text, finish: r.choices[0].finish_reason })),
      client.completions.create({ ...base(seed++), prompt: `A ${name}:`, response_format: rf, stream: true })
        .then((s) => streamText(s, (c) => c.choices?.[0]?.text)).then((r) => ({ what: `completion stream ${name}`, schema, ...r })),
    );
  }
  checkAll(await Promise.all(jobs));
  // the grammar cache: one lookup a request (requests at once may each compile what none has finished yet);
  // a schema sent again is a hit
  const stats = async () => (await raw(srv.base, '/stats', { method: 'GET' })).json.grammar_cache;
  const st = await stats();
  assert.equal(st.compiles + st.hits, jobs.length);
  assert.ok(st.compiles >= Object.keys(schemas).length);
  await client.completions.create({ ...base(99), max_tokens: 4, prompt: 'x',
    response_format: { type: 'json_schema', json_schema: { name: 'list', schema: schemas.list } } });
  assert.deepEqual(await stats(), { ...st, hits: st.hits + 1 });
});

test('json_object, and llama-server\'s top-level json_schema', async () => {
  const messages = [{ role: 'user', content: 'a fortune' }];
  const jobs = [1, 2, 3].map((seed) =>
    client.chat.completions.create({ ...base(seed), messages, response_format: { type: 'json_object' } }).then((r) => ({
      what: 'json_object', schema: { type: 'object' }, text: r.choices[0].message.content, finish: r.choices[0].finish_reason })));
  for (const seed of [4, 5, 6])
    jobs.push(raw(srv.base, '/v1/completions', { body: JSON.stringify({ ...base(seed), prompt: 'A list:', json_schema: schemas.list }) })
      .then((r) => ({ what: 'json_schema field', schema: schemas.list, text: r.json.choices[0].text, finish: r.json.choices[0].finish_reason })));
  checkAll(await Promise.all(jobs));
});

test('llama-server\'s grammar (GBNF) on chat and completions, streamed and not: every stopped reply is in its language', async () => {
  const answer = { gbnf: 'root ::= ("yes" | "no" | "maybe") "!"  # an answer\n', re: /^(yes|no|maybe)!$/ };
  const list = { gbnf: 'root ::= "[" num ("," num){0,3} "]"\nnum  ::= "-"? [1-9] [0-9]?\n', re: /^\[-?[1-9][0-9]?(,-?[1-9][0-9]?){0,3}\]$/ };
  const jobs = [];
  for (const [g, seed] of [[answer, 1], [list, 2], [answer, 3], [list, 4]]) {
    jobs.push(client.chat.completions.create({ ...base(seed), messages: [{ role: 'user', content: 'a fortune' }], grammar: g.gbnf })
      .then((r) => [g, r.choices[0].message.content, r.choices[0].finish_reason]));
    jobs.push(raw(srv.base, '/v1/completions', { body: JSON.stringify({ ...base(seed), prompt: 'A list:', grammar: g.gbnf, stream: false }) })
      .then((r) => [g, r.json.choices[0].text, r.json.choices[0].finish_reason]));
    jobs.push((async () => {
      const s = await client.chat.completions.create({ ...base(seed + 10), messages: [{ role: 'user', content: 'hi' }], grammar: g.gbnf, stream: true });
      let text = '', finish = null;
      for await (const c of s) {
        text += c.choices[0]?.delta?.content ?? '';
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      return [g, text, finish];
    })());
  }
  let stops = 0;
  for (const [g, text, finish] of await Promise.all(jobs)) {
    if (finish !== 'stop') continue;
    stops++;
    assert.match(text, g.re);
  }
  assert.ok(stops >= 6, `only ${stops} of 12 replies stopped`);
});

test('a constrained reply cut by max_tokens ends with "length"', async () => {
  const r = await client.chat.completions.create({ ...base(7), max_tokens: 3, messages: [{ role: 'user', content: 'hi' }],
    response_format: { type: 'json_schema', json_schema: { name: 'p', schema: schemas.person } } });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
});

test('/v1/responses: text.format json_schema and json_object, streamed and not', async () => {
  // (the Responses API has no logit_bias: schemas whose whitespace is bounded, a top-level enum and a patterned string,
  // always end; an object may run to the limit)
  const code = { type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' };
  const jobs = [[schemas.choice, 0.8], [code, 0.8], [schemas.choice, 0]].map(([schema, temperature]) => {
    const format = { type: 'json_schema', name: 'answer', schema, strict: true };
    return client.responses.create({ model: 'fortune', input: 'a fortune', text: { format }, max_output_tokens: 300, temperature })
      .then((r) => {
        assert.deepEqual(r.text.format, format);
        assert.equal(r.status, 'completed');
        return { what: 'responses', schema, text: r.output_text, finish: 'stop' };
      });
  });
  jobs.push((async () => {
    const s = await client.responses.create({ model: 'fortune', input: 'a fortune', text: { format: { type: 'json_object' } },
      max_output_tokens: 100, temperature: 0.8, stream: true });
    let text = '', status = null;
    for await (const e of s) {
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.completed' || e.type === 'response.incomplete') status = e.response.status;
    }
    assert.ok(['completed', 'incomplete'].includes(status));
    return { what: 'responses stream', schema: { type: 'object' }, text, finish: status === 'completed' ? 'stop' : 'length' };
  })());
  const results = await Promise.all(jobs);
  const stops = results.filter((r) => r.finish === 'stop');
  validate(stops.map((r) => ({ schema: r.schema, text: r.text }))).forEach((x, i) => assert.ok(x.ok, `${stops[i].what}: ${x.error}`));
});

test('bad schemas and unsupported fields are a 400 naming the field', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', dependencies: { a: ['b'] } } } } }, 'response_format', /dependencies/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format', /schema/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: 'str' } } }, 'response_format', /object or a boolean/],
    [{ response_format: { type: 'yaml' } }, 'response_format', /json_schema/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'strin' } } } }, 'response_format', /unknown type/],
    [{ json_schema: { type: 'object', properties: { a: { $ref: 'http://x/y' } } } }, 'json_schema', /ref/],
    [{ response_format: { type: 'json_object' }, json_schema: { type: 'object' } }, 'json_schema', /not both/],
    [{ grammar: 'root ::= thing' }, 'grammar', /'thing' is used but not defined/],
    [{ grammar: 'root ::= "a' }, 'grammar', /unterminated literal/],
    [{ grammar: 7 }, 'grammar', /must be a string/],
    [{ grammar: 'root ::= "a"', json_schema: { type: 'object' } }, 'grammar', /not both/],
  ];
  for (const [extra, param, msg] of cases) {
    for (const route of ['/v1/chat/completions', '/v1/completions']) {
      const body = { model: 'fortune', max_tokens: 8, ...extra, ...(route.includes('chat') ? { messages: [{ role: 'user', content: 'hi' }] } : { prompt: 'hi' }) };
      const r = await raw(srv.base, route, { body: JSON.stringify(body) });
      assert.equal(r.status, 400, `${route} ${JSON.stringify(extra)}: ${r.text}`);
      assert.equal(r.json.error.param, param, r.text);
      assert.match(r.json.error.message, msg);
    }
  }
  const r = await raw(srv.base, '/v1/responses', { body: JSON.stringify({ model: 'fortune', input: 'hi',
    text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', dependencies: { a: ['b'] } } } } }) });
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /dependencies/);
  assert.equal((await raw(srv.base, '/health', { method: 'GET' })).status, 200);
});

const tools = [
  { type: 'function', function: { name: 'get_weather', strict: true, parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', parameters: {
    type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 999 }, b: { type: 'integer', minimum: 0, maximum: 999 } },
    required: ['a', 'b'], additionalProperties: false } } },
];
const paramsOf = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));

test('forced tool calls (required and named), chat and responses, streamed and not: the arguments validate', async () => {
  const s = await startServer(['--parallel', '8', '--chat-template', path.join(here, 'tools_template.jinja')]);
  try {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const messages = [{ role: 'user', content: 'the weather in Paris' }];
    const choices = ['required', { type: 'function', function: { name: 'add' } }, { type: 'function', function: { name: 'get_weather' } }];
    const jobs = [];
    let seed = 10;
    for (const tool_choice of choices)
      for (const stream of [false, true])
        jobs.push((async () => {
          const req = { ...base(seed++), max_tokens: 120, messages, tools, tool_choice };
          if (!stream) {
            const r = await c.chat.completions.create(req);
            return { finish: r.choices[0].finish_reason, calls: r.choices[0].message.tool_calls ?? [], tool_choice };
          }
          const calls = [];
          let finish = null;
          for await (const ch of await c.chat.completions.create({ ...req, stream })) {
            for (const d of ch.choices?.[0]?.delta?.tool_calls ?? []) {
              calls[d.index] ??= { function: { name: '', arguments: '' } };
              calls[d.index].function.name += d.function?.name ?? '';
              calls[d.index].function.arguments += d.function?.arguments ?? '';
            }
            finish = ch.choices?.[0]?.finish_reason ?? finish;
          }
          return { finish, calls, tool_choice };
        })());
    const results = await Promise.all(jobs);
    const done = results.filter((r) => r.finish === 'tool_calls');
    assert.ok(done.length >= results.length / 2, JSON.stringify(results));
    for (const r of results) assert.ok(['tool_calls', 'length'].includes(r.finish), JSON.stringify(r));
    const items = [];
    for (const r of done) {
      assert.equal(r.calls.length, 1);
      const f = r.calls[0].function;
      if (r.tool_choice !== 'required') assert.equal(f.name, r.tool_choice.function.name);
      items.push({ schema: paramsOf[f.name], text: f.arguments });
    }
    validate(items).forEach((x, i) => assert.ok(x.ok, `${x.error}: ${items[i].text}`));
    // the Responses API's forced call
    const rr = await c.responses.create({ model: 'fortune', input: 'add two numbers', max_output_tokens: 120, temperature: 0,
      tools: tools.map((t) => ({ type: 'function', ...t.function })), tool_choice: { type: 'function', name: 'add' } });
    const fc = rr.output.find((o) => o.type === 'function_call');
    if (rr.status === 'completed') {
      assert.equal(fc.name, 'add');
      assert.ok(validate([{ schema: paramsOf.add, text: fc.arguments }])[0].ok, fc.arguments);
    }
    // parameters that do not compile: a 400 naming tools
    const bad = await raw(s.base, '/v1/chat/completions', { body: JSON.stringify({ messages, tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'object', dependencies: { a: ['b'] } } } } } }] }) });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, 'tools');
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});

// custom tools (OpenAI's freeform tools): the input follows the tool's Lark grammar or regex when the call is
// forced; the grammars are bounded so that every forced call closes within max_output_tokens
const customTools = [
  { type: 'custom', name: 'calc', description: 'Adds two numbers',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: "add " NUM " " NUM\nNUM: DIGIT~1..3\n%import common.DIGIT\n' } },
  { type: 'custom', name: 'say', description: 'Says a word, quoted, on a line',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: "say \\"" LCASE_LETTER~1..6 "\\"\\n"\n%import common.LCASE_LETTER\n' } },
  { type: 'custom', name: 'code', description: 'A code', format: { type: 'grammar', syntax: 'regex', definition: '^[0-9]{2}-[a-z]{2}$' } },
];
const inputOf = { calc: /^add [0-9]{1,3} [0-9]{1,3}$/, say: /^say "[a-z]{1,6}"\n$/, code: /^[0-9]{2}-[a-z]{2}$/ };

test('a forced custom tool with a Lark grammar or a regex: the input follows it (responses and chat), bad formats are a 400', async () => {
  const s = await startServer(['--parallel', '8', '--chat-template', path.join(here, 'tools_template.jinja')]);
  try {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const jobs = [];
    for (const name of Object.keys(inputOf))
      for (const stream of [false, true])
        jobs.push((async () => {
          const req = { model: 'fortune', input: `use ${name}`, max_output_tokens: 60, temperature: 0.8,
            tools: customTools, tool_choice: { type: 'custom', name } };
          if (!stream) return { name, r: await c.responses.create(req) };
          let r = null;
          for await (const ev of await c.responses.create({ ...req, stream })) if (ev.type === 'response.completed') r = ev.response;
          return { name, r };
        })());
    for (const { name, r } of await Promise.all(jobs)) {
      assert.equal(r?.status, 'completed', JSON.stringify(r));
      const call = r.output.find((o) => o.type === 'custom_tool_call');
      assert.ok(call, JSON.stringify(r.output));
      assert.equal(call.name, name);
      assert.match(call.input, inputOf[name]);
    }
    // chat completions' shape of a custom tool and of its forced choice
    const chatTools = customTools.map(({ type, format, ...rest }) => ({ type, custom: { ...rest,
      format: { type: 'grammar', grammar: { syntax: format.syntax, definition: format.definition } } } }));
    const cr = await c.chat.completions.create({ model: 'fortune', max_tokens: 60, seed: 3, temperature: 0.8,
      messages: [{ role: 'user', content: 'say a word' }], tools: chatTools, tool_choice: { type: 'custom', custom: { name: 'say' } } });
    assert.equal(cr.choices[0].finish_reason, 'tool_calls', JSON.stringify(cr));
    const call = cr.choices[0].message.tool_calls[0];
    assert.equal(call.type, 'custom', JSON.stringify(call));
    assert.equal(call.custom.name, 'say');
    assert.match(call.custom.input, inputOf.say);
    // streamed, and the call and its output sent back as history
    let streamed = null;
    for await (const ch of await c.chat.completions.create({ model: 'fortune', max_tokens: 60, temperature: 0.8, stream: true,
      messages: [{ role: 'user', content: 'a code' }], tools: chatTools, tool_choice: { type: 'custom', custom: { name: 'code' } } }))
      streamed = ch.choices?.[0]?.delta?.tool_calls?.[0] ?? streamed;
    assert.equal(streamed?.type, 'custom', JSON.stringify(streamed));
    assert.match(streamed.custom.input, inputOf.code);
    const next = await c.chat.completions.create({ model: 'fortune', max_tokens: 4, tools: chatTools, messages: [
      { role: 'user', content: 'say a word' }, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: 'said' }] });
    assert.ok(next.choices[0].finish_reason, JSON.stringify(next));
    // malformed formats and grammars that do not compile: a 400 naming the field and the problem, forced or not
    const bad = [
      [{ type: 'grammar', syntax: 'ebnf', definition: 'x' }, /format\.syntax must be "lark" or "regex"/],
      [{ type: 'grammar', syntax: 'lark' }, /format\.definition must be a string/],
      [{ type: 'grammar', syntax: 'lark', definition: 'start: ( "a"' }, /format\.definition: the lark grammar cannot be used: .*missing '\)'/],
      [{ type: 'grammar', syntax: 'lark', definition: 'start: A\nA.2: "a"' }, /priorities/],
      [{ type: 'grammar', syntax: 'regex', definition: '(?=a)' }, /lookaround/],
      [{ type: 'yaml' }, /format\.type must be "text" or "grammar"/],
    ];
    for (const [format, msg] of bad)
      for (const tool_choice of ['auto', { type: 'custom', name: 't' }]) {
        const r = await raw(s.base, '/v1/responses', { body: JSON.stringify({ model: 'fortune', input: 'hi', max_output_tokens: 4,
          tools: [{ type: 'custom', name: 't', format }], tool_choice }) });
        assert.equal(r.status, 400, `${JSON.stringify(format)}: ${r.text}`);
        assert.equal(r.json.error.param, 'tools', r.text);
        assert.match(r.json.error.message, msg);
      }
    const cbad = await raw(s.base, '/v1/chat/completions', { body: JSON.stringify({ model: 'fortune', max_tokens: 4,
      messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'custom', custom: { name: 't',
        format: { type: 'grammar', grammar: { syntax: 'lark', definition: 'start: x' } } } }] }) });
    assert.equal(cbad.status, 400, cbad.text);
    assert.equal(cbad.json.error.param, 'tools');
    assert.match(cbad.json.error.message, /tools\[0\]\.custom\.format\.grammar\.definition: .*'x' is used but not defined/);
    // format text: a forced call whose input is any string
    const tr = await c.responses.create({ model: 'fortune', input: 'hi', max_output_tokens: 40, temperature: 0, tools: [
      { type: 'custom', name: 'free', format: { type: 'text' } }], tool_choice: { type: 'custom', name: 'free' } });
    assert.ok(['completed', 'incomplete'].includes(tr.status), JSON.stringify(tr));
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});

test('a strict tool without forcing: the call the model writes is held to the schema from its opening marker on', async () => {
  // the copy model writes a call whose unit is outside the enum: the grammar takes over at the marker
  const answer = 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}\n</tool_call>';
  const messages = [{ role: 'user', content: answer }];
  await withCopyModel(messages, tools, answer, '', async (s) => {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 80 });
    const m = r.choices[0].message;
    assert.equal(m.content, 'Let me look.');
    assert.equal(m.tool_calls.length, 1, JSON.stringify(m));
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    const args = JSON.parse(m.tool_calls[0].function.arguments);
    assert.equal(args.city, 'Paris'); // what the schema allows is the model's own
    assert.ok(validate([{ schema: paramsOf.get_weather, text: m.tool_calls[0].function.arguments }])[0].ok);
  });
});

test('strict tools without forcing: after a call closes the text is free, and the next call is held again', async () => {
  const answer = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n' +
                 '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}}\n</tool_call>';
  const messages = [{ role: 'user', content: answer }];
  await withCopyModel(messages, tools, answer, '', async (s) => {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 120 });
    const calls = r.choices[0].message.tool_calls ?? [];
    assert.equal(calls.length, 2, JSON.stringify(r.choices[0].message));
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { a: 1, b: 2 });
    assert.equal(calls[1].function.name, 'get_weather');
    assert.ok(validate([{ schema: paramsOf.get_weather, text: calls[1].function.arguments }])[0].ok, calls[1].function.arguments);
  });
});

test('with speculative decoding on, constrained rows decode without drafts beside rows that draft', async () => {
  const s = await startServer(['--parallel', '4', '--spec-ngram']);
  try {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const messages = [{ role: 'user', content: 'a fortune about cats' }];
    const rf = { type: 'json_schema', json_schema: { name: 'person', schema: schemas.person } };
    const [a, b, plain] = await Promise.all([
      c.chat.completions.create({ ...base(21), messages, response_format: rf }),
      c.chat.completions.create({ ...base(22), messages, response_format: rf, temperature: 0 }),
      c.chat.completions.create({ model: 'fortune', messages, temperature: 0, max_tokens: 64 }),
    ]);
    for (const r of [a, b]) {
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.ok(validate([{ schema: schemas.person, text: r.choices[0].message.content }])[0].ok, r.choices[0].message.content);
      assert.equal(r.timings.draft_n, 0);
    }
    assert.ok(plain.choices[0].message.content.length > 0);
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});
