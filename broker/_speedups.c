/* C twin of the link log's record writer (robust/_link_writer.py: LinkRecordWriter._body and
 * _tail_of, whose pure-Python versions stay the definition: this returns exactly the bytes they
 * return, or declines, and tests/broker/test_link_writer_speedups.py holds the two to that on
 * arbitrary records).
 *
 * Why C: the sequenced fan-out writes one link record per delivery, ten per message at ten
 * subscribers, and the Python writer spends about 2.4 us on each, nearly all of it interpreter
 * overhead around a dozen varints. It reads its arguments and builds one bytes object; it keeps
 * no state.
 *
 * The contract: `link_bodies(records, kinds)` is the concatenation of the Avro bodies of
 * `records` (a list of LinkRecord tuples) as link_record v2 lays them out, or None where any
 * value is not plainly right (a type that is not exactly int, str or bool, a number outside its
 * Avro range, a kind not in `kinds`, text that is not valid UTF-8, a record that is not a tuple
 * of the expected size). None sends the caller down the Python path, which then writes, falls
 * back to the generic codec or raises exactly as it always did.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* LinkRecord's fields, in its NamedTuple order. */
enum {
    F_LINK, F_ORDINAL, F_EPOCH, F_EPOCH_START, F_BITS, F_LINK_SEQ, F_KIND, F_POSITION, F_SOURCE,
    F_SOURCE_SEQ, F_OWNER, F_WRITER, F_RECORDED_AT, F_SNAPSHOT, N_FIELDS
};

typedef struct {
    char *data;
    Py_ssize_t size, cap;
} buffer;

static int
reserve(buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->size + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int
put_varint(buffer *b, uint64_t z)
{
    if (reserve(b, 10) < 0)
        return -1;
    while (z >= 0x80) {
        b->data[b->size++] = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    b->data[b->size++] = (char)z;
    return 0;
}

static int
put_octet(buffer *b, char c)
{
    if (reserve(b, 1) < 0)
        return -1;
    b->data[b->size++] = c;
    return 0;
}

/* 1 and the number where `obj` is exactly an int within [low, high]; 0 where it is not (no
 * error set); -1 on an error. */
static int
exact_int(PyObject *obj, long long low, long long high, long long *value)
{
    int overflow = 0;
    if (!PyLong_CheckExact(obj))
        return 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < low || v > high)
        return 0;
    *value = v;
    return 1;
}

/* Avro long (zig-zag varint) of `obj` when it is exactly an int in `low..high`: 1 written,
 * 0 declined, -1 error. */
static int
put_long(buffer *b, PyObject *obj, long long low, long long high)
{
    long long v;
    int ok = exact_int(obj, low, high, &v);
    if (ok <= 0)
        return ok;
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    return put_varint(b, z) < 0 ? -1 : 1;
}

#define PUT_LONG(b, obj) put_long((b), (obj), LLONG_MIN, LLONG_MAX)
#define PUT_INT(b, obj) put_long((b), (obj), -2147483648LL, 2147483647LL)

/* Avro string of `obj` when it is exactly a str of valid UTF-8: 1, 0 or -1 as put_long. */
static int
put_string(buffer *b, PyObject *obj)
{
    Py_ssize_t n;
    if (!PyUnicode_CheckExact(obj))
        return 0;
    const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();  /* a lone surrogate: the Python path says what happens to it */
        return 0;
    }
    if (put_varint(b, (uint64_t)n << 1) < 0 || reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->size, s, (size_t)n);
    b->size += n;
    return 1;
}

/* [null, T] union: None, or branch 1 and the value put by `put`. */
static int
put_optional(buffer *b, PyObject *obj, int (*put)(buffer *, PyObject *))
{
    if (obj == Py_None)
        return put_octet(b, 0) < 0 ? -1 : 1;
    if (put_octet(b, 2) < 0)
        return -1;
    return put(b, obj);
}

static int put_long_any(buffer *b, PyObject *obj) { return PUT_LONG(b, obj); }

/* One record's body: 1 written, 0 declined, -1 error. Only a LinkRecord whose position is
 * None or a Position: the Python writer reads them by attribute, and anything else fares there
 * as it fares. */
static int
put_record(buffer *b, PyObject *r, PyObject *kinds, PyObject *record_type,
           PyObject *position_type)
{
    int ok;
    if (!Py_IS_TYPE(r, (PyTypeObject *)record_type) || PyTuple_GET_SIZE(r) != N_FIELDS)
        return 0;
    PyObject **f = &PyTuple_GET_ITEM(r, 0);
    PyObject *snapshot = f[F_SNAPSHOT];
    if (snapshot != Py_True && snapshot != Py_False)
        return 0;
    if ((ok = put_string(b, f[F_LINK])) <= 0 || (ok = PUT_LONG(b, f[F_ORDINAL])) <= 0
            || (ok = PUT_LONG(b, f[F_EPOCH])) <= 0 || (ok = PUT_LONG(b, f[F_EPOCH_START])) <= 0
            || (ok = PUT_INT(b, f[F_BITS])) <= 0)
        return ok;
    /* the kind's enum index, as the Python writer's table has it (a LinkKind is a str) */
    PyObject *kind = PyDict_GetItemWithError(kinds, f[F_KIND]);
    if (kind == NULL) {
        if (!PyErr_Occurred())
            return 0;
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();  /* unhashable: the Python path takes it */
        return 0;
    }
    if (!PyBytes_CheckExact(kind) || PyBytes_GET_SIZE(kind) != 1)
        return 0;
    if (put_octet(b, PyBytes_AS_STRING(kind)[0]) < 0)
        return -1;
    PyObject *pos = f[F_POSITION];
    if (pos == Py_None) {
        if (put_octet(b, 0) < 0 || put_octet(b, 0) < 0)
            return -1;
    } else {
        if (!Py_IS_TYPE(pos, (PyTypeObject *)position_type) || PyTuple_GET_SIZE(pos) != 2)
            return 0;
        if (put_octet(b, 2) < 0)
            return -1;
        if ((ok = PUT_INT(b, PyTuple_GET_ITEM(pos, 0))) <= 0)
            return ok;
        if (put_octet(b, 2) < 0)
            return -1;
        if ((ok = PUT_LONG(b, PyTuple_GET_ITEM(pos, 1))) <= 0)
            return ok;
    }
    if ((ok = put_optional(b, f[F_SOURCE], put_string)) <= 0
            || (ok = put_optional(b, f[F_SOURCE_SEQ], put_long_any)) <= 0
            || (ok = put_optional(b, f[F_OWNER], put_string)) <= 0
            || (ok = PUT_LONG(b, f[F_WRITER])) <= 0 || (ok = PUT_LONG(b, f[F_RECORDED_AT])) <= 0)
        return ok;
    return put_octet(b, snapshot == Py_True ? 1 : 0) < 0 ? -1 : 1;
}

PyDoc_STRVAR(link_bodies_doc,
"link_bodies(records, kinds, LinkRecord, Position) -> bytes | None\n"
"\n"
"The link_record v2 bodies of `records` (LinkRecords), one after another; None to decline.");

static PyObject *
link_bodies(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "link_bodies() takes records, kinds, LinkRecord and Position");
        return NULL;
    }
    PyObject *records = args[0], *kinds = args[1], *record_type = args[2],
             *position_type = args[3];
    if (!PyList_Check(records) || !PyDict_Check(kinds) || !PyType_Check(record_type)
            || !PyType_Check(position_type)
            || !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)
            || !PyType_IsSubtype((PyTypeObject *)position_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "link_bodies() takes a list, a dict and two tuple types");
        return NULL;
    }
    buffer b = {NULL, 0, 0};
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        int ok = put_record(&b, PyList_GET_ITEM(records, i), kinds, record_type,
                            position_type);
        if (ok < 0)
            goto done;
        if (ok == 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize(b.data ? b.data : "", b.size);
done:
    PyMem_Free(b.data);
    return out;
}

static PyMethodDef methods[] = {
    {"link_bodies", (PyCFunction)(void (*)(void))link_bodies, METH_FASTCALL, link_bodies_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "broker._speedups",
    "C twin of the link log's record writer (LinkRecordWriter's bodies).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module_def);
}
