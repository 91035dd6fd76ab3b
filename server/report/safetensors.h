/* safetensors.h - a model from a safetensors file (safetensors.c): the
 * format `psctl save` writes (an 8-byte little-endian header length, a
 * JSON header naming each tensor's dtype, shape and byte range, then the
 * tensors' bytes), read at start for init_from. */
#ifndef SRV_SAFETENSORS_H
#define SRV_SAFETENSORS_H

#include "server/store/psd.h"

/* Makes s's model the one in the safetensors file path: its layout is
 * the file's tensors in the order of their data (as `psctl save` writes
 * them: float32, back to back, covering the data exactly), its values
 * the file's, version 0, the optimizer's state fresh; s->model_file
 * names the file. The file is checked whole before the model is touched
 * for what can be checked without the values: opened, long enough for
 * its header and the data the header describes and no longer, a header
 * that is JSON of safetensors' form, F32 tensors only, a layout psd can
 * hold (names, ranks, max_params). The values must be finite. Returns 0,
 * or a negative PS_E* code with a message naming the file in err (the
 * model then empty). At start, on a model that has no layout yet. */
int srv_safetensors_load(psd *s, const char *path, char *err, size_t errlen);

#endif
