/* A small JSON reader/writer for the parameter-file header, so liboscar.so
 * needs nothing beyond libc (engines that only serve should not pull in a
 * JSON library). It implements the subset of jansson's API that
 * params_file.c uses, under jansson's names mapped to oscar_json_* symbols
 * (no clash with a program that also links jansson), with jansson's output
 * bytes for JSON_COMPACT | JSON_SORT_KEYS so files are rewritten byte for
 * byte. Internal; not installed. */
#ifndef OSCAR_JSON_LITE_H
#define OSCAR_JSON_LITE_H

#include <stddef.h>

typedef struct oscar_json oscar_json;
typedef long long oscar_json_int;
typedef struct oscar_json_error {
    char text[160];
    int position; /* byte offset of the problem in the input */
} oscar_json_error;

/* The jansson names (tests/test_json_lite.c compares with jansson itself and
 * defines OSCAR_JSON_NO_JANSSON_NAMES). */
#ifndef OSCAR_JSON_NO_JANSSON_NAMES
#define json_t oscar_json
#define json_int_t oscar_json_int
#define json_error_t oscar_json_error

#define JSON_COMPACT OSCAR_JSON_COMPACT
#define JSON_SORT_KEYS OSCAR_JSON_SORT_KEYS
#define JSON_REJECT_DUPLICATES OSCAR_JSON_REJECT_DUPLICATES

#define json_object oscar_json_object
#define json_array oscar_json_array
#define json_integer oscar_json_integer
#define json_string oscar_json_string
#define json_boolean oscar_json_boolean
#define json_decref oscar_json_decref
#define json_object_set_new oscar_json_object_set_new
#define json_object_set oscar_json_object_set
#define json_array_append_new oscar_json_array_append_new
#define json_dumps oscar_json_dumps
#define json_loadb oscar_json_loadb
#define json_object_get oscar_json_object_get
#define json_is_object oscar_json_is_object
#define json_is_array oscar_json_is_array
#define json_is_string oscar_json_is_string
#define json_is_integer oscar_json_is_integer
#define json_is_boolean oscar_json_is_boolean
#define json_is_true oscar_json_is_true
#define json_integer_value oscar_json_integer_value
#define json_string_value oscar_json_string_value
#define json_string_length oscar_json_string_length
#define json_array_size oscar_json_array_size
#define json_array_get oscar_json_array_get
/* Insertion order, as jansson. */
#define json_object_foreach(obj, key, val) \
    for (size_t oscar_json_it_ = 0; oscar_json_object_nth((obj), oscar_json_it_, &(key), &(val)); oscar_json_it_++)
#endif

#define OSCAR_JSON_COMPACT 0x1u
#define OSCAR_JSON_SORT_KEYS 0x2u
#define OSCAR_JSON_REJECT_DUPLICATES 0x4u

/* Constructors return a new reference, or NULL when out of memory. */
oscar_json *oscar_json_object(void);
oscar_json *oscar_json_array(void);
oscar_json *oscar_json_integer(oscar_json_int v);
oscar_json *oscar_json_string(const char *s); /* NULL for NULL or invalid UTF-8 */
oscar_json *oscar_json_boolean(int v);
void oscar_json_decref(oscar_json *v);
/* *_new steal the value's reference (also on failure); 0 on success, -1 otherwise. */
int oscar_json_object_set_new(oscar_json *obj, const char *key, oscar_json *v);
int oscar_json_object_set(oscar_json *obj, const char *key, oscar_json *v);
int oscar_json_array_append_new(oscar_json *arr, oscar_json *v);
/* malloc'ed text (free() it), or NULL. Flags: JSON_COMPACT, JSON_SORT_KEYS. */
char *oscar_json_dumps(const oscar_json *v, unsigned flags);
/* Parses exactly buf[0..len) (an object or array, then only whitespace).
 * NULL with err filled on failure. JSON_REJECT_DUPLICATES refuses a repeated
 * key; otherwise the last one wins. */
oscar_json *oscar_json_loadb(const char *buf, size_t len, unsigned flags, oscar_json_error *err);

oscar_json *oscar_json_object_get(const oscar_json *obj, const char *key); /* borrowed, NULL if absent */
int oscar_json_is_object(const oscar_json *v);
int oscar_json_is_array(const oscar_json *v);
int oscar_json_is_string(const oscar_json *v);
int oscar_json_is_integer(const oscar_json *v);
int oscar_json_is_boolean(const oscar_json *v);
int oscar_json_is_true(const oscar_json *v);
oscar_json_int oscar_json_integer_value(const oscar_json *v); /* 0 unless an integer */
const char *oscar_json_string_value(const oscar_json *v);     /* NULL unless a string */
size_t oscar_json_string_length(const oscar_json *v);
size_t oscar_json_array_size(const oscar_json *v);
oscar_json *oscar_json_array_get(const oscar_json *arr, size_t i); /* borrowed */
/* i-th key/value of an object in insertion order; 0 past the end. */
int oscar_json_object_nth(const oscar_json *obj, size_t i, const char **key, oscar_json **val);

#endif /* OSCAR_JSON_LITE_H */
