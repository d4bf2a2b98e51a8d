/* The compiled fast readers of two wire formats, each of which the general path (lxml and the
 * MIME parser) defines; each layout is also spelled as regular expressions in a test oracle:
 *
 * - match_layout: the layout checks of _canonical.match_data, held to the oracle
 *   tests/apex/canonical_oracle.py (match_data_python) on arbitrary input by
 *   tests/apex/test_canonical_speedups.py. Notes below, then further down scan_batch's own.
 * - scan_batch: the layout checks of batch_fast.match_batch, held to the oracle
 *   tests/apex/batch_oracle.py (match_batch_python) by tests/apex/test_batch_speedups.py.
 *
 * match_layout: the layout checks of _canonical.match_data (this returns exactly what the
 * oracle's checks decide).
 *
 * Why C: match_data was the relay's largest Python function per data (5-10 us, about a fifth
 * of the server's time on a data), nearly all of it interpreter overhead around a few compiled
 * regexes, slices and bytes.find()s over a few hundred octets. Everything here is octet
 * comparisons; the parties (the rest of the control document after `<data ...>`) go back to
 * Python, which caches them by their text.
 *
 * What is left undecided: a control document that is not ASCII, where strict UTF-8 and
 * the XML character rules decide -- and arguments of unexpected types. For those match_layout
 * returns True, "undecided": match_data declines and the general path reads it. Declining
 * (None) is always safe to decide early, whatever guard fails first, because the oracle is a
 * pure predicate with one answer; so the checks below run nearly in the Python order, but need not.
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

/* The character classes of the oracles' patterns (tests/apex/canonical_oracle.py and
 * batch_oracle.py), one bit each in `classes` (filled once, at import, from these spellings of
 * them). */
#define IN_BCHAR 1  /* _BCHARS: [0-9A-Za-z()+_,./:=?-] */
#define IN_ID 2     /* _ID: [0-9A-Za-z!#$*+\-./:=?@^_`{|}~] */
#define IN_WS 4     /* _WS: [ \t\r\n] */
#define IN_PRINT 8  /* [ -~], of _CONTENT_PART's media type */
#define IN_VALUE 16  /* batch_oracle._V on ASCII: [ -~] but & < > ' */
#define IN_MEDIA 32  /* batch_oracle._MEDIA's class: [!-~] but & ' < > */
#define IN_DIGIT 64  /* [0-9] */
#define IN_LOWER 128  /* [a-z] */
static const char alnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
static const char base64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static unsigned char classes[256];
/* Each octet of base64_alphabet's value, its index there; NOT_BASE64 for the others (0x80, so
 * that OR-ing the values of a group tells whether one was not: values are below 64). */
#define NOT_BASE64 0x80
static unsigned char base64_value[256];

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
    for (i = 0x20; i <= 0x7e; i++) {
        classes[i] |= IN_PRINT;
        if (i != '&' && i != '<' && i != '>' && i != '\'')
            classes[i] |= IN_VALUE | (i != ' ' ? IN_MEDIA : 0);
    }
    memset(base64_value, NOT_BASE64, sizeof(base64_value));
    for (i = 0; i < 64; i++)
        base64_value[(unsigned char)base64_alphabet[i]] = (unsigned char)i;
    for (c = "0123456789"; *c; c++)
        classes[(unsigned char)*c] |= IN_DIGIT;
    for (i = 'a'; i <= 'z'; i++)
        classes[i] |= IN_LOWER;
}

/* The longest run of octets of class `cls` at p (before end): its end. */
static inline const char *
run(const char *p, const char *end, unsigned int cls)
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

    /* The layout is canonical. A control document that is not ASCII is the general path's to
     * read: it must be strict UTF-8 without the characters canonical_oracle._UNSAFE_TEXT names.
     * The opening matched is ASCII, so only the rest can hold such an octet. */
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

/* --- scan_batch -----------------------------------------------------------------------------
 *
 * Why C: a subscriber of live batches spends nearly half its time per delivery in
 * batch_fast.match_batch, nearly all of it interpreter overhead around one compiled regex per
 * item, its groups, int()s, a find() and a2b_base64() over a few hundred octets. Here that
 * layout is read octet by octet, as the oracle's regexes read it. Every check that goes
 * through the general path's own functions stays in Python: the link id, epoch, source,
 * publish type, topic and token, checked once per combination by a data Stamp's constructor and
 * remembered (_known); so does building each item's Stamp (varied_stamp).
 *
 * batch_oracle's patterns are deterministic on any text: every `V+`, `{_N}`, `[a-z]{1,16}` and
 * media type is followed by a quote its class excludes, so it is the longest run of its class
 * there and must be of a length in its bounds; every optional group begins with a blank and a
 * name that neither the other optional groups nor what follows them begin with, so it is taken
 * wherever it matches, and where it half matches the item fails either way. The data and the
 * heartbeat pattern are one up to `kind='`.
 *
 * What is left undecided (True; match_batch declines and the general path reads it): any
 * heartbeat item (idle links: rare), a content of base64 characters and "=" that is not base64
 * in its canonical form (which padding a2b_base64's strict mode takes differs between Python
 * versions; what the broker writes is canonical), and arguments other than exactly bytes and
 * an int of C's size. Declining (None) is safe at whichever guard fails first: the oracle
 * returns None if any of its guards fails, whatever the order. No state is kept; every object
 * built is either returned or released.
 */

/* _robust_syntax's MAX_BATCH_ITEMS, MAX_MESSAGE_ID_LEN and MAX_LONG (MAX_LINK_SEQ is
 * UINT64_MAX), and the {1,20} digits, [a-z]{1,16} publish type and {1,255} media type of
 * batch_oracle's patterns. */
#define MAX_BATCH_ITEMS 4096
#define MAX_MESSAGE_ID_LEN 1024
#define MAX_LONG 9223372036854775807ULL
#define MAX_DIGITS 20
#define MAX_TYPE 16
#define MAX_BATCH_MEDIA 255
#define UNBOUNDED PY_SSIZE_T_MAX
#define DATA_END "</content></item>"

/* A group of a pattern: its octets, or p == NULL where an optional group did not match. */
typedef struct {
    const char *p;
    Py_ssize_t n;
} span;

/* `lit` (an attribute's blank, name and opening quote), then 1..max octets of class `cls`, then
 * the closing quote, at p: the octets as *v; the position after the quote, or NULL if the text
 * there is anything else. */
static const char *
quoted(const char *p, const char *end, const char *lit, size_t n, unsigned int cls,
       Py_ssize_t max, span *v)
{
    const char *q;
    if (!take(&p, end, lit, n))
        return NULL;
    q = run(p, end, cls);
    if (q == p || q - p > max || q == end || *q != '\'')
        return NULL;
    v->p = p;
    v->n = q - p;
    return q + 1;
}

/* An optional group `(?:lit...')?` (see quoted): steps *p past it where it matches. */
static void
optional(const char **p, const char *end, const char *lit, size_t n, unsigned int cls,
         Py_ssize_t max, span *v)
{
    const char *q = quoted(*p, end, lit, n, cls, max, v);
    if (q != NULL)
        *p = q;
    else
        v->p = NULL;
}

/* An optional group `(lit)?` of fixed text: steps *p past it where it matches. */
static void
flag(const char **p, const char *end, const char *lit, size_t n, span *v)
{
    v->p = *p;
    v->n = (Py_ssize_t)n;
    if (!take(p, end, lit, n))
        v->p = NULL;
}

#define QUOTED(p, end, lit, cls, max, v) \
    quoted((p), (end), (lit), sizeof(lit) - 1, (cls), (max), (v))
#define OPTIONAL(p, end, lit, cls, max, v) \
    optional(&(p), (end), (lit), sizeof(lit) - 1, (cls), (max), (v))
#define FLAG(p, end, lit, v) flag(&(p), (end), (lit), sizeof(lit) - 1, (v))

/* int() of at most MAX_DIGITS digits, as *value; -1 if it exceeds UINT64_MAX. */
static int
to_u64(span v, uint64_t *value)
{
    uint64_t x = 0, d;
    Py_ssize_t i;
    for (i = 0; i < v.n; i++) {
        d = (uint64_t)(v.p[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *value = x;
    return 0;
}

/* Why [p, end) is not base64 in its canonical form (groups of four characters, the last of two
 * or three padded to four with "="): -1 if an octet is neither of the alphabet nor "=" (which
 * a2b_base64(..., strict_mode=True) refuses in every Python version), else 1. */
static int
not_canonical(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p != '=' && base64_value[(unsigned char)*p] == NOT_BASE64)
            return -1;
    return 1;
}

/* The octets [p, end) encodes if it is base64 in its canonical form, as a2b_base64 decodes
 * them (the bits a short last group leaves over are dropped). Else NULL with *form set (see
 * not_canonical); NULL with *form 0 is an error. One pass: each group is checked as it is
 * decoded, and an output found to be unwanted is released. */
static PyObject *
base64_decode(const char *p, const char *end, int *form)
{
    const unsigned char *s = (const unsigned char *)p;
    Py_ssize_t n = end - p, full, i;
    unsigned int a, b, c, d, pads;
    unsigned char *out;
    PyObject *result;

    *form = 0;
    if (n % 4 != 0) {
        *form = not_canonical(p, end);
        return NULL;
    }
    pads = n > 0 && end[-1] == '=' ? 1 + (end[-2] == '=') : 0;
    result = PyBytes_FromStringAndSize(NULL, n / 4 * 3 - pads);
    if (result == NULL)
        return NULL;
    out = (unsigned char *)PyBytes_AS_STRING(result);
    full = pads ? n - 4 : n;
    for (i = 0; i < full; i += 4) {
        a = base64_value[s[i]];
        b = base64_value[s[i + 1]];
        c = base64_value[s[i + 2]];
        d = base64_value[s[i + 3]];
        if ((a | b | c | d) & NOT_BASE64)
            goto other;
        *out++ = (unsigned char)(a << 2 | b >> 4);
        *out++ = (unsigned char)(b << 4 | c >> 2);
        *out++ = (unsigned char)(c << 6 | d);
    }
    if (pads) {  /* the last group: two characters and "==", or three and "=" */
        a = base64_value[s[i]];
        b = base64_value[s[i + 1]];
        c = pads == 1 ? base64_value[s[i + 2]] : 0;
        if ((a | b | c) & NOT_BASE64)
            goto other;
        *out++ = (unsigned char)(a << 2 | b >> 4);
        if (pads == 1)
            *out++ = (unsigned char)(b << 4 | c >> 2);
    }
    return result;
other:
    Py_DECREF(result);
    *form = not_canonical(p, end);
    return NULL;
}

/* A data item's groups, named as in _DATA_ITEM.groups(). */
typedef struct {
    span link, epoch, link_seq, source, source_seq, type, topic, token, message_id, time,
        snapshot, in_re, refill, media;
} data_item;

/* _DATA_ITEM.match(text, p, end): its groups in *m, and the position after it (the start of
 * the content); NULL if it does not match. *heartbeat is set where the item is a heartbeat's
 * instead (the prefix the two patterns share matches, then kind='heartbeat'). */
static const char *
read_item(const char *p, const char *end, data_item *m, int *heartbeat)
{
    *heartbeat = 0;
    if (!TAKE(p, end, "<item>")
            || (p = QUOTED(p, end, "<seq link='", IN_VALUE, UNBOUNDED, &m->link)) == NULL)
        return NULL;
    OPTIONAL(p, end, " epoch='", IN_DIGIT, MAX_DIGITS, &m->epoch);
    if ((p = QUOTED(p, end, " linkseq='", IN_DIGIT, MAX_DIGITS, &m->link_seq)) == NULL
            || !TAKE(p, end, " kind='"))
        return NULL;
    if (TAKE(p, end, "heartbeat'")) {
        *heartbeat = 1;
        return NULL;
    }
    if (!TAKE(p, end, "data'")
            || (p = QUOTED(p, end, " source='", IN_VALUE, UNBOUNDED, &m->source)) == NULL
            || (p = QUOTED(p, end, " sourceseq='", IN_DIGIT, MAX_DIGITS, &m->source_seq)) == NULL
            || (p = QUOTED(p, end, " type='", IN_LOWER, MAX_TYPE, &m->type)) == NULL
            || (p = QUOTED(p, end, " topic='", IN_VALUE, UNBOUNDED, &m->topic)) == NULL)
        return NULL;
    OPTIONAL(p, end, " token='", IN_VALUE, UNBOUNDED, &m->token);
    OPTIONAL(p, end, " messageid='", IN_VALUE, UNBOUNDED, &m->message_id);
    OPTIONAL(p, end, " time='", IN_DIGIT, MAX_DIGITS, &m->time);
    FLAG(p, end, " snapshot='true'", &m->snapshot);
    /* a selecting subscription's ids: each checked in Python, as a key's part (batch_fast) */
    OPTIONAL(p, end, " inre='", IN_VALUE, UNBOUNDED, &m->in_re);
    FLAG(p, end, " refill='true'", &m->refill);
    if (!TAKE(p, end, " /><content")
            || (p = QUOTED(p, end, " type='", IN_MEDIA, MAX_BATCH_MEDIA, &m->media)) == NULL
            || !TAKE(p, end, ">"))
        return NULL;
    return p;
}

/* A group's text, or None where it did not match. */
static PyObject *
group(span v)
{
    if (v.p == NULL)
        Py_RETURN_NONE;
    return ascii_str(v.p, v.n);
}

/* A new int, or None where the group did not match. */
static PyObject *
number(span v, uint64_t value)
{
    if (v.p == NULL)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(value);
}

/* Whether two groups have the same text (or neither matched). */
static int
same_text(span x, span y)
{
    if (x.p == NULL || y.p == NULL)
        return x.p == y.p;
    return x.n == y.n && memcmp(x.p, y.p, (size_t)x.n) == 0;
}

/* Whether two data items of one batch have the same _known key (the link is the batch's). */
static int
same_key(const data_item *m, const data_item *other)
{
    return same_text(m->epoch, other->epoch) && same_text(m->source, other->source)
        && same_text(m->type, other->type) && same_text(m->topic, other->topic)
        && same_text(m->token, other->token) && same_text(m->snapshot, other->snapshot)
        && same_text(m->refill, other->refill) && same_text(m->in_re, other->in_re);
}

/* One item of scan_batch's result (see its docstring): its key is `key` if not NULL (the
 * previous item's, equal to this one's; borrowed), else made of `link` (the batch's) and
 * m's groups. `content` is the decoded content, a new reference this takes over, whatever it
 * returns. */
static PyObject *
data_fields(const data_item *m, PyObject *key, PyObject *link, uint64_t link_seq,
            uint64_t source_seq, uint64_t time, PyObject *content)
{
    const span *keyed[8] = {&m->epoch, &m->source, &m->type, &m->topic, &m->token, &m->snapshot,
                            &m->refill, &m->in_re};
    PyObject *item, *v;
    int i;

    /* a tuple's unset slots are NULL, which releasing it skips */
    if (key != NULL) {
        Py_INCREF(key);
    } else {
        key = PyTuple_New(9);
        if (key == NULL) {
            Py_DECREF(content);
            return NULL;
        }
        Py_INCREF(link);
        PyTuple_SET_ITEM(key, 0, link);
        for (i = 0; i < 8; i++) {
            if ((v = group(*keyed[i])) == NULL) {
                Py_DECREF(key);
                Py_DECREF(content);
                return NULL;
            }
            PyTuple_SET_ITEM(key, i + 1, v);
        }
    }
    item = PyTuple_New(7);
    if (item == NULL) {
        Py_DECREF(key);
        Py_DECREF(content);
        return NULL;
    }
    PyTuple_SET_ITEM(item, 0, key);
    PyTuple_SET_ITEM(item, 5, content);
#define SET(i, expr) if ((v = (expr)) == NULL) goto error; PyTuple_SET_ITEM(item, (i), v)
    SET(1, PyLong_FromUnsignedLongLong(link_seq));
    SET(2, PyLong_FromUnsignedLongLong(source_seq));
    SET(3, number(m->time, time));
    SET(4, group(m->message_id));
    SET(6, group(m->media));
#undef SET
    return item;
error:
    Py_DECREF(item);
    return NULL;
}

PyDoc_STRVAR(scan_batch_doc,
"scan_batch(content, max_bytes) -> (link, items)\n"
"\n"
"match_batch()'s checks of everything but the values the general path's functions check:\n"
"`link` is the batch's link and `items` a list of one tuple per item, (key, link_seq,\n"
"source_seq, time, message_id, content, media_type): `key` is _known's key (link, epoch,\n"
"source, type, topic, token, snapshot, refill, inre), each a str as _DATA_ITEM's group (or\n"
"None), the numbers are ints within their bounds (time None where absent), `content` the\n"
"decoded octets. None to decline; True when the pure-Python match_batch must decide (a\n"
"heartbeat item, a content not in canonical base64 yet not refused on sight, or arguments\n"
"that are not exactly bytes and an int of C's size).");

static PyObject *
scan_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *buf, *end, *p, *stop;
    Py_ssize_t size, max_bytes;
    span link;
    data_item m, previous;
    int heartbeat, form;
    uint64_t link_seq, source_seq, time = 0;
    PyObject *link_text, *items, *content, *item, *result, *previous_key = NULL;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_batch() takes 2 arguments");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[1]))
        Py_RETURN_TRUE;
    max_bytes = PyLong_AsSsize_t(args[1]);
    if (max_bytes == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_TRUE;
    }
    memset(&previous, 0, sizeof(previous));  /* read only once set: this quiets the compiler */
    buf = PyBytes_AS_STRING(args[0]);
    size = PyBytes_GET_SIZE(args[0]);
    if (size > max_bytes || !is_ascii(buf, buf + size))
        Py_RETURN_NONE;

    /* _HEAD.match(text) and text.endswith(_END); the items lie between. */
    end = buf + size;
    p = QUOTED(buf, end, "<batch link='", IN_VALUE, UNBOUNDED, &link);
    if (p == NULL || !TAKE(p, end, ">") || size < 8 || memcmp(end - 8, "</batch>", 8) != 0)
        Py_RETURN_NONE;
    end -= 8;
    if (p > end)
        Py_RETURN_NONE;  /* no items, and no `pos == end` at the end */
    link_text = ascii_str(link.p, link.n);
    if (link_text == NULL)
        return NULL;
    items = PyList_New(0);
    if (items == NULL) {
        Py_DECREF(link_text);
        return NULL;
    }
    while (p < end) {
        if (PyList_GET_SIZE(items) == MAX_BATCH_ITEMS)
            goto decline;  /* one item more than the oracle takes */
        p = read_item(p, end, &m, &heartbeat);
        if (p == NULL)
            goto heartbeat_or_decline;
        if (m.link.n != link.n || memcmp(m.link.p, link.p, (size_t)link.n) != 0
                || (m.message_id.p != NULL && m.message_id.n > MAX_MESSAGE_ID_LEN)
                || to_u64(m.link_seq, &link_seq) < 0 || link_seq == 0
                || to_u64(m.source_seq, &source_seq) < 0 || source_seq == 0
                || source_seq > MAX_LONG
                || (m.time.p != NULL && (to_u64(m.time, &time) < 0 || time > MAX_LONG)))
            goto decline;
        /* text.find(_DATA_END, start, end), and strict base64 up to it */
        stop = memmem(p, (size_t)(end - p), DATA_END, sizeof(DATA_END) - 1);
        if (stop == NULL)
            goto decline;
        content = base64_decode(p, stop, &form);
        if (content == NULL) {
            if (form < 0)
                goto decline;
            if (form > 0)
                goto undecided;
            goto error;
        }
        /* the items of a batch mostly share their key: one tuple, hashed once in Python */
        item = data_fields(&m, previous_key != NULL && same_key(&m, &previous) ? previous_key
                           : NULL, link_text, link_seq, source_seq, time, content);
        if (item == NULL)
            goto error;
        previous = m;
        previous_key = PyTuple_GET_ITEM(item, 0);  /* borrowed: `items` holds it */
        if (PyList_Append(items, item) < 0) {
            Py_DECREF(item);
            goto error;
        }
        Py_DECREF(item);
        p = stop + sizeof(DATA_END) - 1;
    }
    /* p == end: every step stays within it */
    if (PyList_GET_SIZE(items) == 0)
        goto decline;
    result = PyTuple_Pack(2, link_text, items);
    Py_DECREF(link_text);
    Py_DECREF(items);
    return result;

heartbeat_or_decline:
    if (heartbeat)
        goto undecided;
decline:
    Py_DECREF(link_text);
    Py_DECREF(items);
    Py_RETURN_NONE;
undecided:
    Py_DECREF(link_text);
    Py_DECREF(items);
    Py_RETURN_TRUE;
error:
    Py_DECREF(link_text);
    Py_DECREF(items);
    return NULL;
}

static PyMethodDef methods[] = {
    {"match_layout", (PyCFunction)(void (*)(void))match_layout, METH_FASTCALL, match_layout_doc},
    {"scan_batch", (PyCFunction)(void (*)(void))scan_batch, METH_FASTCALL, scan_batch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "adapters.apex._speedups",
    "C twins of _canonical.match_data()'s and batch_fast.match_batch()'s layout checks.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (classes['0'] == 0)
        fill_classes();
    return PyModule_Create(&module_def);
}
