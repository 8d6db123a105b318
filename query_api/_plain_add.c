/* The API's hottest write, a plain durable AddCount, read and encoded in C (query_api.plain_add).

   read_add(body: bytes, namespaces: dict[str, str])
       -> (namespace, counter_name, delta, counter_type, token | None, generation_time: str | int | None) | None

   `body` is the request's JSON. It is taken only in its plainest form: one object holding the keys "namespace",
   "counter_name" and "delta", and optionally "idempotency_token", an object of "token" and optionally
   "generation_time"; each key once, in any order, with JSON whitespace anywhere between tokens. Every string is
   printable ASCII without escapes (no '"', no '\'); the counter name 1-200 characters without a space
   (schemas.validation's rule for an ASCII name); the delta a JSON integer within 64 bits; the generation time a
   string or a JSON integer within 64 bits; the namespace a key of `namespaces` (the namespaces whose plain adds
   may take this path, each mapped to its counter type's name). Anything else returns None, and the request goes
   the way it went before this module existed: nothing is refused here, so there is one implementation of every
   error (the token and the generation time are validated by the caller, as for any write).

   encode_add(namespace: str, counter_name: str, delta: int, counter_type: str, event_time: int, token: str)
       -> (avro_body: bytes, answer: bytes) | None

   `avro_body` is the CountMutation body schemas.codec.mutation_body encodes for the ADD of that delta at
   `event_time` with token `token` and no item key; `answer` is the AddCount response JSON
   query_api.responses.add_json writes. None when a string is not printable ASCII without '"' or '\' (the answer
   would need escapes). Tests hold both byte-equal to those functions, and every body read_add takes to what the
   Python fast path (query_api.fastpath) reads from it.

   plain_request(data: bytes) -> body: bytes | None

   The body of `data` when `data` is exactly one complete request "POST /v1/AddCount HTTP/1.1" whose headers are
   all of a few plain kinds (Host, Content-Type, Content-Length once, User-Agent, Accept, Accept-Encoding, Connection:
   keep-alive; names in any case, values printable ASCII) and whose body is exactly Content-Length bytes, at most
   MAX_REQUEST_BODY: what a keep-alive client sends for one AddCount, read without the HTTP parser's callbacks (one
   Python call each: query_api.http_protocol). Anything else returns None and goes to the parser. Tests hold every
   request it takes to what httptools reads from it; add_request reads requests with the same code.

   add_request(data: bytes, namespaces: dict[str, str])
       -> (avro_body: bytes, answer: bytes, key: str, event: tuple) | body: bytes | None

   plain_request, read_add and encode_add in one call, for the commonest write: a plain request whose plain body
   brings no idempotency token. Its event time is now (the clock time.time_ns reads) and its token is drawn here as
   producers.new_token draws one: 16 hex digits drawn once per process (again in a forked child) followed by 16 of
   this process's next number; the prefix is this module's own, so its tokens and new_token's never meet. `key` is
   "namespace:counter_name" and `event` (event time, token, "", delta, False): what query_api.early_persist notes.
   A plain request of such a namespace whose plain body brings a token or a generation time returns its body (the
   caller validates them: CounterService.write_plain); anything else None. Why one call: the three calls, the token
   and the clock read in Python were 0.8 µs of an AddCount's 4 µs of Python (no network). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

/* A JSON string (plain_string) or integer (plain_integer) at p; the byte after it, or NULL. */
static const char *plain_scalar(const char *p, const char *end, span *text, int64_t *number, int *is_text) {
    *is_text = p < end && *p == '"';
    return *is_text ? plain_string(p, end, text) : plain_integer(p, end, number);
}

/* The fields of a plain body (read_add): `token.at` is NULL where there is no token, `has_when` says whether a
   generation time was given, and `when_is_text` whether as a string (`when`) or an integer (`when_number`). */
typedef struct {
    span ns, counter, token, when;
    int64_t delta, when_number;
    int has_when, when_is_text;
} plain_body;

static int key_is(span key, const char *name) {
    size_t len = strlen(name);
    return (size_t)key.len == len && memcmp(key.at, name, len) == 0;
}

/* The members of an object at p (its '{'), each handed to `member` with the byte after the key's ':' (and
   whitespace); the byte after the object's '}', or NULL. `member` returns the byte after the value, or NULL. */
typedef const char *(*member_fn)(span key, const char *p, const char *end, plain_body *out, unsigned *seen);

static const char *object(const char *p, const char *end, member_fn member, plain_body *out, unsigned *seen) {
    if (p >= end || *p != '{')
        return NULL;
    p++;
    for (;;) {
        span key;
        p = plain_string(skip_ws(p, end), end, &key);
        if (p == NULL)
            return NULL;
        p = skip_ws(p, end);
        if (p >= end || *p != ':')
            return NULL;
        p = member(key, skip_ws(p + 1, end), end, out, seen);
        if (p == NULL)
            return NULL;
        p = skip_ws(p, end);
        if (p >= end)
            return NULL;
        if (*p == '}')
            return p + 1;
        if (*p != ',')
            return NULL;
        p++;
    }
}

enum { SEEN_NS = 1, SEEN_COUNTER = 2, SEEN_DELTA = 4, SEEN_TOKEN_OBJECT = 8, SEEN_TOKEN = 16, SEEN_WHEN = 32 };

/* Another key, or one twice, is not the plain form. */
static const char *token_member(span key, const char *p, const char *end, plain_body *out, unsigned *seen) {
    if (key_is(key, "token") && !(*seen & SEEN_TOKEN)) {
        *seen |= SEEN_TOKEN;
        return plain_string(p, end, &out->token);
    }
    if (key_is(key, "generation_time") && !(*seen & SEEN_WHEN)) {
        *seen |= SEEN_WHEN;
        out->has_when = 1;
        return plain_scalar(p, end, &out->when, &out->when_number, &out->when_is_text);
    }
    return NULL;
}

static const char *body_member(span key, const char *p, const char *end, plain_body *out, unsigned *seen) {
    if (key_is(key, "namespace") && !(*seen & SEEN_NS)) {
        *seen |= SEEN_NS;
        return plain_string(p, end, &out->ns);
    }
    if (key_is(key, "counter_name") && !(*seen & SEEN_COUNTER)) {
        *seen |= SEEN_COUNTER;
        return plain_string(p, end, &out->counter);
    }
    if (key_is(key, "delta") && !(*seen & SEEN_DELTA)) {
        *seen |= SEEN_DELTA;
        return plain_integer(p, end, &out->delta);
    }
    if (key_is(key, "idempotency_token") && !(*seen & SEEN_TOKEN_OBJECT)) {
        *seen |= SEEN_TOKEN_OBJECT;
        return object(p, end, token_member, out, seen);
    }
    return NULL;
}

/* Parse a plain body; 1 and its fields, or 0. */
static int parse(const char *p, const char *end, plain_body *out) {
    unsigned seen = 0;
    memset(out, 0, sizeof *out);
    p = object(skip_ws(p, end), end, body_member, out, &seen);
    if (p == NULL || skip_ws(p, end) != end)
        return 0;
    if ((seen & (SEEN_NS | SEEN_COUNTER | SEEN_DELTA)) != (SEEN_NS | SEEN_COUNTER | SEEN_DELTA))
        return 0;
    if ((seen & SEEN_TOKEN_OBJECT) && !(seen & SEEN_TOKEN))
        return 0; /* a token object without its token: the route names the field */
    return valid_counter_name(out->counter) && out->ns.len <= MAX_NAME;
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

static char *put_span(char *out, const char *at, Py_ssize_t len) {
    memcpy(out, at, (size_t)len);
    return out + len;
}

static PyObject *read_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "read_add(body: bytes, namespaces: dict)");
        return NULL;
    }
    const char *body = PyBytes_AS_STRING(args[0]);
    plain_body b;
    if (!parse(body, body + PyBytes_GET_SIZE(args[0]), &b))
        Py_RETURN_NONE;
    PyObject *ns = PyUnicode_FromStringAndSize(b.ns.at, b.ns.len); /* ASCII: valid UTF-8 */
    if (ns == NULL)
        return NULL;
    PyObject *counter_type = PyDict_GetItemWithError(args[1], ns);
    if (counter_type == NULL) {
        Py_DECREF(ns);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* not a namespace of this path: the Python path decides */
    }
    Py_INCREF(counter_type); /* borrowed from the dict: ours from here, whatever the allocations below run */
    PyObject *token = b.token.at == NULL ? Py_NewRef(Py_None) : PyUnicode_FromStringAndSize(b.token.at, b.token.len);
    PyObject *when = !b.has_when ? Py_NewRef(Py_None)
                     : b.when_is_text ? PyUnicode_FromStringAndSize(b.when.at, b.when.len)
                     : PyLong_FromLongLong(b.when_number);
    if (token == NULL || when == NULL) {
        Py_DECREF(ns);
        Py_DECREF(counter_type);
        Py_XDECREF(token);
        Py_XDECREF(when);
        return NULL;
    }
    /* N: the tuple takes these references (and drops them if it cannot be built) */
    return Py_BuildValue("(Ns#LNNN)", ns, b.counter.at, b.counter.len, (long long)b.delta, counter_type, token, when);
}

/* Whether `text` is printable ASCII without '"' or '\\' (written into JSON as it is); its bytes and length. */
static int plain_text(PyObject *text, const char **at, Py_ssize_t *len) {
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text))
        return 0;
    *at = (const char *)PyUnicode_DATA(text);
    *len = PyUnicode_GET_LENGTH(text);
    for (Py_ssize_t i = 0; i < *len; i++) {
        char c = (*at)[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            return 0;
    }
    return 1;
}

/* The bytes of Avro's long `n` (put_long). */
static Py_ssize_t long_size(int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    Py_ssize_t size = 1;
    while (z > 0x7f) {
        z >>= 7;
        size++;
    }
    return size;
}

#define ANSWER_NS "{\"namespace\":\""
#define ANSWER_COUNTER "\",\"counter_name\":\""
#define ANSWER_TYPE "\",\"counter_type\":\""
#define ANSWER_TOKEN "\",\"durable\":true,\"idempotency_token\":\""
#define ANSWER_END "\"}"
#define FIXED(text) ((Py_ssize_t)sizeof(text) - 1)

/* The Avro body and the answer of an ADD (encode_add), into *avro and *answer, each allocated at its size; 0 with
   an exception set if out of memory. Every span is printable ASCII without '"' or '\\'. */
static int encode(span ns, span counter, span type, span token, int64_t delta, int64_t event_time, PyObject **avro,
                  PyObject **answer) {
    /* The Avro body: op ADD (enum index 0), namespace, counter, delta, event time, token, empty item key. */
    *avro = PyBytes_FromStringAndSize(NULL, 1 + long_size(ns.len) + ns.len + long_size(counter.len) + counter.len +
                                                long_size(delta) + long_size(event_time) + long_size(token.len) +
                                                token.len + 1);
    if (*avro == NULL)
        return 0;
    char *p = PyBytes_AS_STRING(*avro);
    *p++ = 0;
    p = put_string(p, ns.at, ns.len);
    p = put_string(p, counter.at, counter.len);
    p = put_long(p, delta);
    p = put_long(p, event_time);
    p = put_string(p, token.at, token.len);
    *p = 0;

    /* The answer, as orjson writes add_json's dict: nothing in these strings needs escaping. */
    *answer = PyBytes_FromStringAndSize(NULL, FIXED(ANSWER_NS) + ns.len + FIXED(ANSWER_COUNTER) + counter.len +
                                                  FIXED(ANSWER_TYPE) + type.len + FIXED(ANSWER_TOKEN) + token.len +
                                                  FIXED(ANSWER_END));
    if (*answer == NULL) {
        Py_CLEAR(*avro);
        return 0;
    }
    p = put_span(PyBytes_AS_STRING(*answer), ANSWER_NS, FIXED(ANSWER_NS));
    p = put_span(p, ns.at, ns.len);
    p = put_span(p, ANSWER_COUNTER, FIXED(ANSWER_COUNTER));
    p = put_span(p, counter.at, counter.len);
    p = put_span(p, ANSWER_TYPE, FIXED(ANSWER_TYPE));
    p = put_span(p, type.at, type.len);
    p = put_span(p, ANSWER_TOKEN, FIXED(ANSWER_TOKEN));
    p = put_span(p, token.at, token.len);
    put_span(p, ANSWER_END, FIXED(ANSWER_END));
    return 1;
}

static PyObject *encode_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || !PyLong_Check(args[2]) || !PyLong_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "encode_add(namespace: str, counter_name: str, delta: int, "
                                         "counter_type: str, event_time: int, token: str)");
        return NULL;
    }
    span ns, counter, type, token;
    if (!plain_text(args[0], &ns.at, &ns.len) || !plain_text(args[1], &counter.at, &counter.len) ||
        !plain_text(args[3], &type.at, &type.len) || !plain_text(args[5], &token.at, &token.len))
        Py_RETURN_NONE;
    int64_t delta = PyLong_AsLongLong(args[2]);
    if (delta == -1 && PyErr_Occurred())
        return NULL;
    int64_t event_time = PyLong_AsLongLong(args[4]);
    if (event_time == -1 && PyErr_Occurred())
        return NULL;
    PyObject *avro, *answer;
    if (!encode(ns, counter, type, token, delta, event_time, &avro, &answer))
        return NULL;
    return Py_BuildValue("(NN)", avro, answer);
}

#define MAX_REQUEST_BODY (16 * 1024) /* query_api.http_protocol.MAX_FAST_BODY */
#define REQUEST_LINE "POST /v1/AddCount HTTP/1.1\r\n"

/* Whether [at, at + len) equals `lower` ignoring ASCII case (`lower` is lower case). */
static int name_is(const char *at, Py_ssize_t len, const char *lower) {
    if ((size_t)len != strlen(lower))
        return 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        char c = at[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lower[i])
            return 0;
    }
    return 1;
}

/* The body of [p, end) when it is exactly one plain AddCount request (plain_request): 1 and *body, or 0. */
static int request_body(const char *p, const char *end, span *body) {
    size_t line = strlen(REQUEST_LINE);
    if ((size_t)(end - p) < line || memcmp(p, REQUEST_LINE, line) != 0)
        return 0;
    p += line;
    Py_ssize_t length = -1;
    for (;;) { /* header lines, up to the empty line */
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            p += 2;
            break;
        }
        const char *name = p;
        while (p < end && *p != ':') {
            char c = *p;
            int token = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
            if (!token)
                return 0; /* not a plain header name (or an empty line missing, or folding) */
            p++;
        }
        if (p >= end || p == name)
            return 0;
        Py_ssize_t name_len = p - name;
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *value = p;
        while (p < end && *p != '\r') {
            unsigned char c = (unsigned char)*p;
            if ((c < 0x20 && c != '\t') || c > 0x7e)
                return 0;
            p++;
        }
        if (end - p < 2 || p[1] != '\n')
            return 0;
        const char *value_end = p;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            value_end--;
        p += 2;
        Py_ssize_t value_len = value_end - value;
        if (name_is(name, name_len, "content-length")) {
            if (length >= 0 || value_len < 1 || value_len > 6)
                return 0;
            length = 0;
            for (Py_ssize_t i = 0; i < value_len; i++) {
                if (value[i] < '0' || value[i] > '9')
                    return 0;
                length = length * 10 + (value[i] - '0');
            }
        } else if (name_is(name, name_len, "connection")) {
            if (!name_is(value, value_len, "keep-alive"))
                return 0; /* close, upgrade, anything else: the parser and uvicorn decide */
        } else if (!name_is(name, name_len, "host") && !name_is(name, name_len, "content-type") &&
                   !name_is(name, name_len, "user-agent") && !name_is(name, name_len, "accept") &&
                   !name_is(name, name_len, "accept-encoding")) {
            return 0; /* Expect, Transfer-Encoding, Upgrade, an API key...: not the plain case */
        }
    }
    if (length < 0 || length > MAX_REQUEST_BODY || end - p != length)
        return 0;
    body->at = p;
    body->len = length;
    return 1;
}


static PyObject *plain_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "plain_request(data: bytes)");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(args[0]);
    span body;
    if (!request_body(p, p + PyBytes_GET_SIZE(args[0]), &body))
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(body.at, body.len);
}

/* add_request's tokens: this process's prefix (16 hex digits) and its next number. */
static char token_prefix[16];
static uint64_t token_number;

static void draw_token_prefix(void) {
    static const char hex[] = "0123456789abcdef";
    uint64_t raw;
    if (getrandom(&raw, sizeof raw, 0) != (ssize_t)sizeof raw) { /* no entropy source: still this process's own */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        raw = ((uint64_t)getpid() << 40) ^ (uint64_t)now.tv_sec * 1000000000u ^ (uint64_t)now.tv_nsec;
    }
    for (int i = 0; i < 16; i++)
        token_prefix[i] = hex[(raw >> (60 - 4 * i)) & 0xf];
    token_number = 0;
}

/* A str of the ASCII bytes [at, at + len). */
static PyObject *ascii_str(const char *at, Py_ssize_t len) {
    PyObject *text = PyUnicode_New(len, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), at, (size_t)len);
    return text;
}

/* The value of `namespaces` under the name `ns`, borrowed, or NULL: a walk over the few entries, comparing bytes,
   costs less than making and hashing a str to look it up. */
static PyObject *namespace_value(PyObject *namespaces, span ns) {
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(namespaces, &pos, &name, &value))
        if (PyUnicode_Check(name) && PyUnicode_IS_ASCII(name) && PyUnicode_GET_LENGTH(name) == ns.len &&
            memcmp(PyUnicode_DATA(name), ns.at, (size_t)ns.len) == 0)
            return value;
    return NULL;
}

static PyObject *add_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add_request(data: bytes, namespaces: dict)");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(args[0]);
    span request, type;
    plain_body b;
    if (!request_body(data, data + PyBytes_GET_SIZE(args[0]), &request) ||
        !parse(request.at, request.at + request.len, &b))
        Py_RETURN_NONE;
    PyObject *counter_type = namespace_value(args[1], b.ns);
    if (counter_type == NULL || !plain_text(counter_type, &type.at, &type.len))
        Py_RETURN_NONE; /* not a namespace of this path: the Python path decides */
    if (b.token.at != NULL || b.has_when) /* the caller validates them */
        return PyBytes_FromStringAndSize(request.at, request.len);
    Py_INCREF(counter_type); /* its text is read below, after allocations that may run arbitrary code */

    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now); /* time.time_ns's clock */
    int64_t event_time = (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
    static const char hex[] = "0123456789abcdef";
    char token_text[32];
    uint64_t number = token_number++;
    memcpy(token_text, token_prefix, 16);
    for (int i = 0; i < 16; i++)
        token_text[16 + i] = hex[(number >> (60 - 4 * i)) & 0xf];
    span token = {token_text, 32};

    PyObject *avro = NULL, *answer = NULL, *key = NULL, *event = NULL, *out = NULL;
    if (!encode(b.ns, b.counter, type, token, b.delta, event_time, &avro, &answer))
        goto done;
    /* "namespace:counter" (a namespace name has no ':') */
    key = PyUnicode_New(b.ns.len + 1 + b.counter.len, 127);
    if (key == NULL)
        goto done;
    char *k = (char *)PyUnicode_DATA(key);
    memcpy(k, b.ns.at, (size_t)b.ns.len);
    k[b.ns.len] = ':';
    memcpy(k + b.ns.len + 1, b.counter.at, (size_t)b.counter.len);
    event = PyTuple_New(5);
    if (event == NULL)
        goto done;
    PyObject *item;
    if ((item = PyLong_FromLongLong(event_time)) == NULL)
        goto done;
    PyTuple_SET_ITEM(event, 0, item);
    if ((item = ascii_str(token_text, 32)) == NULL)
        goto done;
    PyTuple_SET_ITEM(event, 1, item);
    if ((item = PyUnicode_New(0, 127)) == NULL) /* the empty str */
        goto done;
    PyTuple_SET_ITEM(event, 2, item);
    if ((item = PyLong_FromLongLong(b.delta)) == NULL)
        goto done;
    PyTuple_SET_ITEM(event, 3, item);
    PyTuple_SET_ITEM(event, 4, Py_NewRef(Py_False));
    out = PyTuple_New(4);
    if (out == NULL)
        goto done;
    PyTuple_SET_ITEM(out, 0, avro);
    PyTuple_SET_ITEM(out, 1, answer);
    PyTuple_SET_ITEM(out, 2, key);
    PyTuple_SET_ITEM(out, 3, event);
    avro = answer = key = event = NULL; /* the tuple's now */
done:
    Py_DECREF(counter_type);
    Py_XDECREF(avro);
    Py_XDECREF(answer);
    Py_XDECREF(key);
    Py_XDECREF(event); /* drops the items set so far; a tuple's unset items are NULL */
    return out;
}

static PyMethodDef methods[] = {
    {"plain_request", (PyCFunction)(void (*)(void))plain_request, METH_FASTCALL,
     "plain_request(data) -> body | None: the body of exactly one plain AddCount request"},
    {"read_add", (PyCFunction)(void (*)(void))read_add, METH_FASTCALL,
     "read_add(body, namespaces) -> (namespace, counter_name, delta, counter_type, token, generation_time) | None"},
    {"encode_add", (PyCFunction)(void (*)(void))encode_add, METH_FASTCALL,
     "encode_add(namespace, counter_name, delta, counter_type, event_time, token) -> (avro_body, answer) | None"},
    {"add_request", (PyCFunction)(void (*)(void))add_request, METH_FASTCALL,
     "add_request(data, namespaces) -> (avro_body, answer, key, event) | body | None: a whole plain AddCount"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "query_api._plain_add", "A plain durable AddCount read and encoded in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__plain_add(void) {
    draw_token_prefix();
    if (pthread_atfork(NULL, NULL, draw_token_prefix) != 0) { /* a forked child draws its own */
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
