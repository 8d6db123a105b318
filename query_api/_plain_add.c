/* The API's hottest write, a plain durable AddCount, parsed and encoded in one C call (query_api.plain_add).

   plain_add(body: bytes, namespaces: dict[str, str], event_time: int, token: str)
       -> (namespace: str, counter_name: str, delta: int, avro_body: bytes, answer: bytes) | None

   `body` is the request's JSON. It is taken only in its plainest form: one object holding exactly the keys
   "namespace", "counter_name" and "delta", each once, in any order, with JSON whitespace anywhere between tokens;
   both strings printable ASCII without escapes (no '"', no '\'); the counter name 1-200 characters without a space
   (schemas.validation's rule for an ASCII name); the delta a JSON integer within 64 bits; the namespace a key of
   `namespaces` (the namespaces whose plain adds may take this path, each mapped to its counter type's name).
   Anything else returns None, and the request goes the way it went before this module existed: nothing is refused
   here, so there is one implementation of every error.

   `avro_body` is the CountMutation body schemas.codec.mutation_body encodes for the ADD of that delta at
   `event_time` with token `token` and no item key; `answer` is the AddCount response JSON
   query_api.responses.add_json writes (`token` must be printable ASCII without '"' or '\', as new_token's are,
   or None is returned). Tests hold both byte-equal to those functions, and every accepted body to
   what the Python fast path (query_api.fastpath) reads from it. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 ""
#endif

#define MAX_COUNTER_NAME 200
#define MAX_NAME 1024 /* a namespace name longer than this is not the plain case */

typedef struct {
    const char *at;
    Py_ssize_t len;
} span;

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A JSON string of printable ASCII without escapes, at p (the opening quote); the byte after it, or NULL. */
static const char *plain_string(const char *p, const char *end, span *out) {
    if (p >= end || *p != '"')
        return NULL;
    const char *start = ++p;
    while (p < end && *p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c > 0x7e || c == '\\')
            return NULL;
        p++;
    }
    if (p >= end)
        return NULL;
    out->at = start;
    out->len = p - start;
    return p + 1;
}

/* A JSON integer within 64 bits (no fraction, no exponent), at p; the byte after it, or NULL. */
static const char *plain_integer(const char *p, const char *end, int64_t *out) {
    int negative = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9')
        return NULL; /* a leading zero is not JSON */
    uint64_t magnitude = 0;
    const uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (p < end && *p >= '0' && *p <= '9') {
        uint64_t digit = (uint64_t)(*p - '0');
        if (magnitude > (limit - digit) / 10)
            return NULL;
        magnitude = magnitude * 10 + digit;
        p++;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL; /* a number that is not an integer: the app decides */
    *out = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return p;
}

static int valid_counter_name(span name) {
    if (name.len < 1 || name.len > MAX_COUNTER_NAME)
        return 0;
    for (Py_ssize_t i = 0; i < name.len; i++)
        if (name.at[i] == ' ') /* plain_string admitted printable ASCII only: '!'..'~' remain */
            return 0;
    return 1;
}

/* Parse the plain body; 1 and the three fields, or 0. */
static int parse(const char *p, const char *end, span *ns, span *counter, int64_t *delta) {
    int seen_ns = 0, seen_counter = 0, seen_delta = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p++;
    for (;;) {
        span key;
        p = plain_string(skip_ws(p, end), end, &key);
        if (p == NULL)
            return 0;
        p = skip_ws(p, end);
        if (p >= end || *p != ':')
            return 0;
        p = skip_ws(p + 1, end);
        if (key.len == 9 && memcmp(key.at, "namespace", 9) == 0 && !seen_ns) {
            p = plain_string(p, end, ns);
            seen_ns = 1;
        } else if (key.len == 12 && memcmp(key.at, "counter_name", 12) == 0 && !seen_counter) {
            p = plain_string(p, end, counter);
            seen_counter = 1;
        } else if (key.len == 5 && memcmp(key.at, "delta", 5) == 0 && !seen_delta) {
            p = plain_integer(p, end, delta);
            seen_delta = 1;
        } else {
            return 0; /* another key, or one twice */
        }
        if (p == NULL)
            return 0;
        p = skip_ws(p, end);
        if (p >= end)
            return 0;
        if (*p == '}')
            break;
        if (*p != ',')
            return 0;
        p++;
    }
    if (skip_ws(p + 1, end) != end)
        return 0;
    return seen_ns && seen_counter && seen_delta && valid_counter_name(*counter) && ns->len <= MAX_NAME;
}

/* Avro's long: zigzag, then 7 bits per byte, low group first. */
static char *put_long(char *out, int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    while (z > 0x7f) {
        *out++ = (char)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    *out++ = (char)z;
    return out;
}

static char *put_string(char *out, const char *at, Py_ssize_t len) {
    out = put_long(out, (int64_t)len);
    memcpy(out, at, (size_t)len);
    return out + len;
}

static char *put_text(char *out, const char *text) {
    size_t len = strlen(text);
    memcpy(out, text, len);
    return out + len;
}

static char *put_span(char *out, const char *at, Py_ssize_t len) {
    memcpy(out, at, (size_t)len);
    return out + len;
}

static PyObject *plain_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyDict_Check(args[1]) || !PyLong_Check(args[2]) ||
        !PyUnicode_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "plain_add(body: bytes, namespaces: dict, event_time: int, token: str)");
        return NULL;
    }
    const char *body = PyBytes_AS_STRING(args[0]);
    span ns = {NULL, 0}, counter = {NULL, 0};
    int64_t delta = 0;
    if (!parse(body, body + PyBytes_GET_SIZE(args[0]), &ns, &counter, &delta))
        Py_RETURN_NONE;

    PyObject *ns_name = PyUnicode_FromStringAndSize(ns.at, ns.len); /* ASCII: valid UTF-8 */
    if (ns_name == NULL)
        return NULL;
    PyObject *counter_type = PyDict_GetItemWithError(args[1], ns_name); /* borrowed */
    if (counter_type == NULL || !PyUnicode_Check(counter_type) || !PyUnicode_IS_ASCII(counter_type) ||
        !PyUnicode_IS_ASCII(args[3])) {
        Py_DECREF(ns_name);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* not a namespace of this path (or an odd value): the Python path decides */
    }
    int64_t event_time = PyLong_AsLongLong(args[2]);
    if (event_time == -1 && PyErr_Occurred()) {
        Py_DECREF(ns_name);
        return NULL;
    }
    const char *token = (const char *)PyUnicode_DATA(args[3]);
    Py_ssize_t token_len = PyUnicode_GET_LENGTH(args[3]);
    for (Py_ssize_t i = 0; i < token_len; i++) {
        if (token[i] < 0x20 || token[i] == '"' || token[i] == '\\' || token[i] == 0x7f) {
            Py_DECREF(ns_name);
            Py_RETURN_NONE; /* a token the answer would have to escape (new_token's never are) */
        }
    }
    const char *type_name = (const char *)PyUnicode_DATA(counter_type);
    Py_ssize_t type_len = PyUnicode_GET_LENGTH(counter_type);

    /* The Avro body: op ADD (enum index 0), namespace, counter, delta, event time, token, empty item key. */
    Py_ssize_t avro_cap = 1 + (10 + ns.len) + (10 + counter.len) + 10 + 10 + (10 + token_len) + 1;
    PyObject *avro = PyBytes_FromStringAndSize(NULL, avro_cap);
    if (avro == NULL) {
        Py_DECREF(ns_name);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(avro);
    char *p = out;
    *p++ = 0;
    p = put_string(p, ns.at, ns.len);
    p = put_string(p, counter.at, counter.len);
    p = put_long(p, delta);
    p = put_long(p, event_time);
    p = put_string(p, token, token_len);
    *p++ = 0;
    if (_PyBytes_Resize(&avro, p - out) < 0) {
        Py_DECREF(ns_name);
        return NULL;
    }

    /* The answer, as orjson writes add_json's dict: nothing in these strings needs escaping. */
    Py_ssize_t answer_cap = 96 + ns.len + counter.len + type_len + token_len;
    PyObject *answer = PyBytes_FromStringAndSize(NULL, answer_cap);
    if (answer == NULL) {
        Py_DECREF(ns_name);
        Py_DECREF(avro);
        return NULL;
    }
    out = PyBytes_AS_STRING(answer);
    p = put_text(out, "{\"namespace\":\"");
    p = put_span(p, ns.at, ns.len);
    p = put_text(p, "\",\"counter_name\":\"");
    p = put_span(p, counter.at, counter.len);
    p = put_text(p, "\",\"counter_type\":\"");
    p = put_span(p, type_name, type_len);
    p = put_text(p, "\",\"durable\":true,\"idempotency_token\":\"");
    p = put_span(p, token, token_len);
    p = put_text(p, "\"}");
    if (_PyBytes_Resize(&answer, p - out) < 0) {
        Py_DECREF(ns_name);
        Py_DECREF(avro);
        return NULL;
    }

    PyObject *counter_name = PyUnicode_FromStringAndSize(counter.at, counter.len);
    PyObject *delta_obj = PyLong_FromLongLong(delta);
    if (counter_name == NULL || delta_obj == NULL) {
        Py_DECREF(ns_name);
        Py_DECREF(avro);
        Py_DECREF(answer);
        Py_XDECREF(counter_name);
        Py_XDECREF(delta_obj);
        return NULL;
    }
    PyObject *result = PyTuple_New(5);
    if (result == NULL) {
        Py_DECREF(ns_name);
        Py_DECREF(avro);
        Py_DECREF(answer);
        Py_DECREF(counter_name);
        Py_DECREF(delta_obj);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, ns_name); /* the tuple takes the references */
    PyTuple_SET_ITEM(result, 1, counter_name);
    PyTuple_SET_ITEM(result, 2, delta_obj);
    PyTuple_SET_ITEM(result, 3, avro);
    PyTuple_SET_ITEM(result, 4, answer);
    return result;
}

static PyMethodDef methods[] = {
    {"plain_add", (PyCFunction)(void (*)(void))plain_add, METH_FASTCALL,
     "plain_add(body, namespaces, event_time, token) -> (namespace, counter_name, delta, avro_body, answer) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "query_api._plain_add", "A plain durable AddCount parsed and encoded in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__plain_add(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
