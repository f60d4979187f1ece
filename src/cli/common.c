#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"

#ifndef OSP_SOURCE_DIR
#define OSP_SOURCE_DIR "."
#endif

/* The bundled model: OSPREY_MODEL, else models/fortune next to the binary's
 * source tree or install prefix. */
const char *osp_cli_default_model(void) {
    static char path[4096];
    const char *env = getenv("OSPREY_MODEL");
    if (env && *env) return env;
    const char *cands[] = {OSP_SOURCE_DIR "/models/fortune", "models/fortune", "/usr/local/share/osprey/models/fortune"};
    struct stat sb;
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        snprintf(path, sizeof path, "%s/config.json", cands[i]);
        if (stat(path, &sb) == 0) {
            snprintf(path, sizeof path, "%s", cands[i]);
            return path;
        }
    }
    return NULL;
}
