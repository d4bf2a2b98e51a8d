/* C twins of the two checks every received BEEP message goes through and of the framing of
 * every whole message sent (see _frames.py and _mime.py, whose general paths -- next_frame(),
 * the header loop, frame_bytes() -- are the definition: these return exactly what those
 * return, or decline, and tests/beep/test_fast_paths.py holds them to it on arbitrary input).
 * They are the only fast paths of these three: where they are not built, the general code
 * runs.
 *
 * Why C: on the relay's busiest path a whole message costs about 3.5 us in FrameDecoder's
 * regex-and-int() fast path and 1.4 us in the entity header split, nearly all of it interpreter
 * overhead around a few octet comparisons. Both functions only read their arguments and build
 * new objects; they keep no state, so the sans-I/O core stays what it was.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_SEQNO 4294967295LL

/* Reads `0|[1-9][0-9]{0,maxdigits-1}` at p (before end) followed by `stop`; returns the
 * position after `stop`, or NULL if the text there is anything else. */
static const char *
read_number(const char *p, const char *end, int maxdigits, char stop, long long *value)
{
    long long v = 0;
    int n = 0;
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (++n > maxdigits)
                return NULL;
            v = v * 10 + (*p - '0');
            p++;
        }
    }
    if (p >= end || *p != stop)
        return NULL;
    *value = v;
    return p + 1;
}

static int
get_octets(PyObject *obj, const char **data, Py_ssize_t *size)
{
    if (PyBytes_CheckExact(obj)) {
        *data = PyBytes_AS_STRING(obj);
        *size = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyByteArray_CheckExact(obj)) {
        *data = PyByteArray_AS_STRING(obj);
        *size = PyByteArray_GET_SIZE(obj);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "expected bytes or bytearray, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

PyDoc_STRVAR(scan_whole_doc,
"scan_whole(buf, pos, max_frame_size, types) -> (type, channel, msgno, seqno, payload, end)\n"
"\n"
"FrameDecoder.next_whole() at `pos` of `buf`, with `end` the position after the trailer;\n"
"None where it returns None. `types` is (MSG, RPY, ERR), the values to return as `type`.");

static PyObject *
scan_whole(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *buf, *p, *end;
    Py_ssize_t size_all, pos, max_frame_size;
    long long channel, msgno, seqno, size;
    PyObject *types, *ftype;
    int kind;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan_whole() takes 4 arguments");
        return NULL;
    }
    if (get_octets(args[0], &buf, &size_all) < 0)
        return NULL;
    pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    max_frame_size = PyLong_AsSsize_t(args[2]);
    if (max_frame_size == -1 && PyErr_Occurred())
        return NULL;
    types = args[3];
    if (!PyTuple_CheckExact(types) || PyTuple_GET_SIZE(types) != 3) {
        PyErr_SetString(PyExc_TypeError, "types must be a tuple (MSG, RPY, ERR)");
        return NULL;
    }
    if (pos < 0 || pos > size_all)
        Py_RETURN_NONE;
    p = buf + pos;
    end = buf + size_all;
    if (end - p < 4 || p[3] != ' ')
        Py_RETURN_NONE;
    if (p[0] == 'M' && p[1] == 'S' && p[2] == 'G')
        kind = 0;
    else if (p[0] == 'R' && p[1] == 'P' && p[2] == 'Y')
        kind = 1;
    else if (p[0] == 'E' && p[1] == 'R' && p[2] == 'R')
        kind = 2;
    else
        Py_RETURN_NONE;
    p += 4;
    if ((p = read_number(p, end, 9, ' ', &channel)) == NULL
        || (p = read_number(p, end, 9, ' ', &msgno)) == NULL)
        Py_RETURN_NONE;
    if (end - p < 2 || p[0] != '.' || p[1] != ' ')
        Py_RETURN_NONE;
    p += 2;
    if ((p = read_number(p, end, 10, ' ', &seqno)) == NULL
        || (p = read_number(p, end, 9, '\r', &size)) == NULL)
        Py_RETURN_NONE;
    if (p >= end || *p != '\n')
        Py_RETURN_NONE;
    p++;
    if (seqno > MAX_SEQNO || size > max_frame_size)
        Py_RETURN_NONE;
    /* The payload and "END\r\n" must be buffered; size < 10**9 so this cannot overflow. */
    if (end - p < size + 5)
        Py_RETURN_NONE;
    if (memcmp(p + size, "END\r\n", 5) != 0)
        Py_RETURN_NONE;
    ftype = PyTuple_GET_ITEM(types, kind);
    return Py_BuildValue("(OLLLy#n)", ftype, channel, msgno, seqno, p, (Py_ssize_t)size,
                         (Py_ssize_t)(p - buf) + (Py_ssize_t)size + 5);
}

PyDoc_STRVAR(content_type_only_doc,
"content_type_only(payload, limit) -> (content_type, 'binary', body, (('Content-Type', ct),))\n"
"\n"
"decode_fields() of an entity whose one header is Content-Type, when its header block ends\n"
"within `limit` octets; None for any other entity.");

static PyObject *binary_str;       /* "binary" */
static PyObject *content_type_str; /* "Content-Type" */

static PyObject *
content_type_only(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char name[] = "Content-Type:";
    const char *buf, *p, *end, *v0, *v1;
    Py_ssize_t size_all, limit, stop;
    PyObject *value, *body, *header, *headers, *result;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "content_type_only() takes 2 arguments");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "payload must be bytes");
        return NULL;
    }
    buf = PyBytes_AS_STRING(args[0]);
    size_all = PyBytes_GET_SIZE(args[0]);
    limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    end = buf + size_all;
    if (size_all < (Py_ssize_t)sizeof(name) - 1 || memcmp(buf, name, sizeof(name) - 1) != 0)
        Py_RETURN_NONE;
    p = v0 = buf + sizeof(name) - 1;
    /* [\x20-\x7e\t]* then CRLF CRLF: a Content-Type value _SAFE_VALUE accepts, and no other line */
    while (p < end && ((*p >= 0x20 && *p <= 0x7e) || *p == '\t'))
        p++;
    if (end - p < 4 || memcmp(p, "\r\n\r\n", 4) != 0)
        Py_RETURN_NONE;
    v1 = p;
    stop = (p - buf) + 4;
    if (stop > limit)
        Py_RETURN_NONE;
    /* str.strip() of text of these octets removes exactly the spaces and tabs at either end */
    while (v0 < v1 && (*v0 == ' ' || *v0 == '\t'))
        v0++;
    while (v1 > v0 && (v1[-1] == ' ' || v1[-1] == '\t'))
        v1--;
    value = PyUnicode_DecodeASCII(v0, v1 - v0, "strict");
    if (value == NULL)
        return NULL;
    body = PyBytes_FromStringAndSize(buf + stop, size_all - stop);
    header = body ? PyTuple_Pack(2, content_type_str, value) : NULL;
    headers = header ? PyTuple_Pack(1, header) : NULL;
    result = headers ? PyTuple_Pack(4, value, binary_str, body, headers) : NULL;
    Py_DECREF(value);
    Py_XDECREF(body);
    Py_XDECREF(header);
    Py_XDECREF(headers);
    return result;
}

PyDoc_STRVAR(whole_frame_doc,
"whole_frame(keyword, channel, msgno, seqno, payload) -> bytes\n"
"\n"
"whole_frame_bytes() with the keyword already as bytes (b'MSG', ...): header, payload, trailer.");

/* Writes `v` (>= 0) in decimal at `out`; returns the position after it. */
static char *
put_number(char *out, unsigned long long v)
{
    char digits[20];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *out++ = digits[--n];
    return out;
}

static PyObject *
whole_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long numbers[3];
    char header[3 + 4 * 21 + 4];
    char *h, *out;
    Py_ssize_t size, i;
    PyObject *keyword, *payload, *frame;

    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "whole_frame() takes 5 arguments");
        return NULL;
    }
    keyword = args[0];
    payload = args[4];
    if (!PyBytes_CheckExact(keyword) || PyBytes_GET_SIZE(keyword) != 3
        || !PyBytes_CheckExact(payload)) {
        PyErr_SetString(PyExc_TypeError, "keyword must be 3 bytes and payload bytes");
        return NULL;
    }
    for (i = 0; i < 3; i++) {
        numbers[i] = PyLong_AsUnsignedLongLong(args[i + 1]);
        if (numbers[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    size = PyBytes_GET_SIZE(payload);
    h = header;
    memcpy(h, PyBytes_AS_STRING(keyword), 3);
    h += 3;
    *h++ = ' ';
    h = put_number(h, numbers[0]);
    *h++ = ' ';
    h = put_number(h, numbers[1]);
    memcpy(h, " . ", 3);
    h += 3;
    h = put_number(h, numbers[2]);
    *h++ = ' ';
    h = put_number(h, (unsigned long long)size);
    *h++ = '\r';
    *h++ = '\n';
    frame = PyBytes_FromStringAndSize(NULL, (h - header) + size + 5);
    if (frame == NULL)
        return NULL;
    out = PyBytes_AS_STRING(frame);
    memcpy(out, header, h - header);
    out += h - header;
    memcpy(out, PyBytes_AS_STRING(payload), size);
    memcpy(out + size, "END\r\n", 5);
    return frame;
}

static PyMethodDef methods[] = {
    {"whole_frame", (PyCFunction)(void (*)(void))whole_frame, METH_FASTCALL, whole_frame_doc},
    {"scan_whole", (PyCFunction)(void (*)(void))scan_whole, METH_FASTCALL, scan_whole_doc},
    {"content_type_only", (PyCFunction)(void (*)(void))content_type_only, METH_FASTCALL,
     content_type_only_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "adapters.beep._speedups",
    "C twins of FrameDecoder.next_whole(), whole_frame_bytes() and decode_fields()'s"
    " one-header case.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (binary_str == NULL) {
        binary_str = PyUnicode_InternFromString("binary");
        content_type_str = PyUnicode_InternFromString("Content-Type");
        if (binary_str == NULL || content_type_str == NULL)
            return NULL;
    }
    return PyModule_Create(&module_def);
}
