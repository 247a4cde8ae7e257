/* The one rule for model names, wherever a name comes from (a signed fleet manifest, a file in
 * the models directory, `kiri pull --name`): the name becomes a file name, NAME.gguf, inside a
 * directory, so it must not be able to leave it or hide in it. */
#ifndef KIRI_NAMES_H
#define KIRI_NAMES_H

#include <stddef.h>

/* The longest model name, in bytes. */
#define KIRI_MODEL_NAME_MAX 64

/* Is s[0, len) a model name: 1 to KIRI_MODEL_NAME_MAX bytes of [A-Za-z0-9._-], not starting with
 * '.' (so neither "..", nor a hidden file, nor a path)? */
int kiri_model_name_ok(const char *s, size_t len);

/* Is the NUL-terminated file a model's file name: NAME.gguf with NAME a model name? */
int kiri_model_file_ok(const char *file);

#endif
