/* A C twin of the layout checks of _canonical.match_data (see there: match_data_python stays
 * the definition; this returns exactly what its checks decide, and
 * tests/apex/test_canonical_speedups.py holds the two to it on arbitrary input).
 *
 * Why C: match_data was the relay's largest Python function per data (5-10 us, about a fifth
 * of the server's time on a data), nearly all of it interpreter overhead around a few compiled
 * regexes, slices and bytes.find()s over a few hundred octets. Everything here is octet
 * comparisons; the parties (the rest of the control document after `<data ...>`) go back to
 * Python, which caches them by their text.
 *
 * What stays in Python: a control document that is not ASCII, where strict UTF-8 and
 * _UNSAFE_TEXT decide -- and arguments of unexpected types. For those match_layout returns
 * True, "undecided": the caller runs match_data_python. Declining (None) is always safe to
 * decide early, whatever guard fails first, because match_data is a pure predicate with one
 * answer; so the checks below run nearly in the Python order, but need not.
 *
 * No state is kept (the class table is constant once filled at import); every object built is
 * either returned or released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* _canonical._MAX_ID, _MAX_MEDIA, and the {1,70} of RFC 2046 boundaries. */
#define MAX_ID 256
#define MAX_MEDIA 256
#define MAX_BOUNDARY 70

/* The character classes of _canonical's patterns, one bit each in `classes` (filled once, at
 * import, from these spellings of them). */
#define IN_BCHAR 1  /* _BCHARS: [0-9A-Za-z()+_,./:=?-] */
#define IN_ID 2     /* _ID: [0-9A-Za-z!#$*+\-./:=?@^_`{|}~] */
#define IN_WS 4     /* _WS: [ \t\r\n] */
#define IN_PRINT 8  /* [ -~], of _CONTENT_PART's media type */
static const char alnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
static unsigned char classes[256];

static void
fill_classes(void)
{
    const char *c;
    int i;
    for (c = alnum; *c; c++)
        classes[(unsigned char)*c] |= IN_BCHAR | IN_ID;
    for (c = "()+_,./:=?-"; *c; c++)
        classes[(unsigned char)*c] |= IN_BCHAR;
    for (c = "!#$*+-./:=?@^_`{|}~"; *c; c++)
        classes[(unsigned char)*c] |= IN_ID;
    for (c = " \t\r\n"; *c; c++)
        classes[(unsigned char)*c] |= IN_WS;
    for (i = 0x20; i <= 0x7e; i++)
        classes[i] |= IN_PRINT;
}

/* The longest run of octets of class `cls` at p (before end): its end. */
static inline const char *
run(const char *p, const char *end, unsigned char cls)
{
    while (p < end && (classes[(unsigned char)*p] & cls))
        p++;
    return p;
}

/* If the `n` octets at *p (before end) are `lit`, steps *p past them. */
static inline int
take(const char **p, const char *end, const char *lit, size_t n)
{
    if ((size_t)(end - *p) < n || memcmp(*p, lit, n) != 0)
        return 0;
    *p += n;
    return 1;
}

#define TAKE(p, end, lit) take(&(p), (end), (lit), sizeof(lit) - 1)

/* Whether no octet in [p, end) has its high bit set; eight at a time. */
static int
is_ascii(const char *p, const char *end)
{
    uint64_t word, any = 0;
    for (; end - p >= 8; p += 8) {
        memcpy(&word, p, 8);
        any |= word;
    }
    for (; p < end; p++)
        any |= (unsigned char)*p;
    return (any & 0x8080808080808080ULL) == 0;
}

/* A str of n octets known to be ASCII. */
static PyObject *
ascii_str(const char *p, Py_ssize_t n)
{
    PyObject *s = PyUnicode_New(n, 127);
    if (s != NULL)
        memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
    return s;
}

PyDoc_STRVAR(match_layout_doc,
"match_layout(content_type, body, max_xml_size) -> (content_ref, rest, media_type, content)\n"
"\n"
"match_data()'s checks of everything but the parties: `content_ref` is the `content`\n"
"attribute ('cid:...'), `rest` the control document after `<data ...>`, `media_type` the\n"
"content part's Content-Type and `content` its octets. None to decline; True when the\n"
"pure-Python match_data must decide (a control document that is not ASCII, or arguments\n"
"that are not exactly str, bytes and int).");

static PyObject *
match_layout(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *ct, *ct_end, *boundary, *start_id, *buf, *end, *p, *xml, *xml_end, *found;
    const char *ref, *rest_start, *media;
    Py_ssize_t size, boundary_len, start_id_len, max_xml_size, window, id_len, dlen, media_len;
    Py_ssize_t content_start, content_end;
    char delimiter[4 + MAX_BOUNDARY];
    char quote;
    PyObject *content_ref, *rest, *media_type, *content, *result;

    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "match_layout() takes 3 arguments");
        return NULL;
    }
    if (!PyUnicode_CheckExact(args[0]) || !PyUnicode_IS_COMPACT_ASCII(args[0])
            || !PyBytes_CheckExact(args[1]) || !PyLong_CheckExact(args[2]))
        Py_RETURN_TRUE;
    max_xml_size = PyLong_AsSsize_t(args[2]);
    if (max_xml_size == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_TRUE;
    }
    if (max_xml_size < 0)
        Py_RETURN_NONE;  /* xml_start <= xml_end <= xml_start + max_xml_size cannot hold */

    /* _CONTENT_TYPE.fullmatch(content_type). The boundary and start classes exclude the quote
     * and ">" that end them, so each {1,n} is the longest run, of at most n octets. */
    ct = (const char *)PyUnicode_1BYTE_DATA(args[0]);
    ct_end = ct + PyUnicode_GET_LENGTH(args[0]);
    p = ct;
    if (!TAKE(p, ct_end, "multipart/related; boundary=\""))
        Py_RETURN_NONE;
    boundary = p;
    p = run(p, ct_end, IN_BCHAR);
    boundary_len = p - boundary;
    if (boundary_len < 1 || boundary_len > MAX_BOUNDARY || !TAKE(p, ct_end, "\"; start=\"<"))
        Py_RETURN_NONE;
    start_id = p;
    p = run(p, ct_end, IN_ID);
    start_id_len = p - start_id;
    if (start_id_len < 1 || start_id_len > MAX_ID
            || !TAKE(p, ct_end, ">\"; type=\"application/beep+xml\"") || p != ct_end)
        Py_RETURN_NONE;

    /* body.startswith(start) */
    buf = PyBytes_AS_STRING(args[1]);
    size = PyBytes_GET_SIZE(args[1]);
    end = buf + size;
    p = buf;
    if (!TAKE(p, end, "--") || !take(&p, end, boundary, (size_t)boundary_len)
            || !TAKE(p, end, "\r\nContent-Type: application/beep+xml\r\nContent-ID: <")
            || !take(&p, end, start_id, (size_t)start_id_len) || !TAKE(p, end, ">\r\n\r\n"))
        Py_RETURN_NONE;
    xml = p;

    /* xml_end = body.find(delimiter, xml_start - 2), within xml_start + max_xml_size: a
     * delimiter first found further on (or not at all) fails that bound alike, so the search
     * stops there. One found at xml_start - 2 (in the blank line) fails the other bound. */
    memcpy(delimiter, "\r\n--", 4);
    memcpy(delimiter + 4, boundary, (size_t)boundary_len);
    dlen = 4 + boundary_len;
    window = end - (xml - 2);
    if (max_xml_size < window - 2 - dlen)
        window = 2 + max_xml_size + dlen;  /* occurrences starting up to xml + max_xml_size */
    found = memmem(xml - 2, (size_t)window, delimiter, (size_t)dlen);
    if (found == NULL || found < xml)
        Py_RETURN_NONE;
    xml_end = found;

    /* _DATA_OPEN.match(xml): on the octets, which is the same as on the text (every octet it
     * can match is ASCII, and UTF-8 encodes ASCII as itself). */
    p = xml;
    if (!TAKE(p, xml_end, "<data") || run(p, xml_end, IN_WS) == p)
        Py_RETURN_NONE;
    p = run(p, xml_end, IN_WS);
    if (!TAKE(p, xml_end, "content"))
        Py_RETURN_NONE;
    p = run(p, xml_end, IN_WS);
    if (!TAKE(p, xml_end, "="))
        Py_RETURN_NONE;
    p = run(p, xml_end, IN_WS);
    if (p == xml_end || (*p != '\'' && *p != '"'))
        Py_RETURN_NONE;
    quote = *p++;
    ref = p;
    if (!TAKE(p, xml_end, "cid:"))
        Py_RETURN_NONE;
    p = run(p, xml_end, IN_ID);
    id_len = p - (ref + 4);
    if (id_len < 1 || id_len > MAX_ID || p == xml_end || *p != quote)
        Py_RETURN_NONE;
    p = run(p + 1, xml_end, IN_WS);
    if (!TAKE(p, xml_end, ">"))
        Py_RETURN_NONE;
    /* p: opening.end() */

    /* _CONTENT_PART.match(body, xml_end + len(delimiter)): the media type's class excludes
     * CR, so it is the longest run of [ -~] there, which must neither start nor end with a
     * space. */
    rest_start = p;
    p = xml_end + dlen;
    if (!TAKE(p, end, "\r\nContent-Type: "))
        Py_RETURN_NONE;
    media = p;
    p = run(p, end, IN_PRINT);
    media_len = p - media;
    if (media_len < 1 || media_len > MAX_MEDIA || media[0] == ' ' || p[-1] == ' '
            || !TAKE(p, end, "\r\nContent-Transfer-Encoding: binary\r\nContent-ID: <"))
        Py_RETURN_NONE;
    /* body.startswith(f"{cid}>\r\n\r\n".encode(), part.end()) */
    if (!take(&p, end, ref + 4, (size_t)id_len) || !TAKE(p, end, ">\r\n\r\n"))
        Py_RETURN_NONE;
    content_start = p - buf;
    content_end = size - (dlen + 4);
    if (content_end < content_start)
        Py_RETURN_NONE;
    /* body.endswith(delimiter + b"--\r\n"), and body.find(delimiter, content_start - 2) is
     * that close delimiter: no occurrence starts before it. */
    if (memcmp(buf + content_end, delimiter, (size_t)dlen) != 0
            || memcmp(end - 4, "--\r\n", 4) != 0
            || memmem(buf + content_start - 2, (size_t)(content_end - content_start + 1 + dlen),
                      delimiter, (size_t)dlen) != NULL)
        Py_RETURN_NONE;

    /* The layout is canonical. A control document that is not ASCII is Python's to read: it
     * must be strict UTF-8 without the characters _UNSAFE_TEXT names. The opening matched is
     * ASCII, so only the rest can hold such an octet. */
    if (!is_ascii(rest_start, xml_end))
        Py_RETURN_TRUE;
    content_ref = ascii_str(ref, 4 + id_len);
    rest = content_ref ? ascii_str(rest_start, xml_end - rest_start) : NULL;
    media_type = rest ? ascii_str(media, media_len) : NULL;
    content = media_type ? PyBytes_FromStringAndSize(buf + content_start,
                                                     content_end - content_start) : NULL;
    result = content ? PyTuple_Pack(4, content_ref, rest, media_type, content) : NULL;
    Py_XDECREF(content_ref);
    Py_XDECREF(rest);
    Py_XDECREF(media_type);
    Py_XDECREF(content);
    return result;
}

static PyMethodDef methods[] = {
    {"match_layout", (PyCFunction)(void (*)(void))match_layout, METH_FASTCALL, match_layout_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "adapters.apex._speedups",
    "A C twin of _canonical.match_data()'s layout checks.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (classes['0'] == 0)
        fill_classes();
    return PyModule_Create(&module_def);
}
