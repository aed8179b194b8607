/* A trajectory's wire form in compiled code, for the stream's two ends (transport/wire.py says
 * what each is for and holds the Python versions these must equal).
 *
 *   pack(loss_mask, turn_end) -> bytes | None
 *       flags[i] = loss_mask[i] + turn_end[i]; None when a turn end lies outside loss_mask or
 *       the two lengths differ.
 *   columns(flags, token_ids, logprobs, versions, rewards) -> tuple | int
 *       a received message's six per-token arrays (token_ids, loss_mask, turn_end, logprobs,
 *       versions, rewards): read-only views of the wire fields, which keep the message alive,
 *       and the two masks, new. An int instead when they are invalid: -1 a flag above 2, -2 a
 *       non-finite log-prob or reward, else the number of turn ends, which the rewards do not
 *       match. ValueError when the columns do not hold 4 bytes a flag.
 *   trajectory(cls, image_cls, msg, max_tokens) -> Trajectory | int
 *       the Trajectory of a decoded message, its arrays made as by columns; an int as columns
 *       says, or -3 past max_tokens, -4 when the lengths disagree.
 *   encode_into(trajectory, buffer) -> bool
 *       writes over the bytearray ``buffer`` the msgpack that msgspec writes for the
 *       trajectory's wire fields (transport/schema.py), byte for byte. False, the buffer's
 *       content then unspecified, for anything off the common path: an array that is not 1-D,
 *       C-contiguous, native-order and of its dtype, a number that is not a plain int (64 bits)
 *       or float, a metric or image field of another type, masks that disagree. The caller then
 *       encodes through msgspec, which handles such a value or says what is wrong with it.
 *
 * The wire's floats are read bytewise (msgpack does not align them), so a non-finite value is
 * one whose exponent bits are all ones. The loops are branch-free so that the compiler
 * vectorises them.
 */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "the wire is little-endian: on this host transport/wire.py's numpy path runs"
#endif

#define PY_SSIZE_T_CLEAN
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <Python.h>
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

/* ---- the flags byte ----------------------------------------------------------------------- */

#define ONES 0x0101010101010101ULL

static int any_non_finite(const unsigned char *restrict p, Py_ssize_t n)
{
    uint32_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, p + 4 * i, 4);
        bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

/* Writes the two masks of n flags; the number of turn ends, or -1 for a flag above 2. Eight
 * flags a step: for a flag b <= 2, b != 0 is bit 0 | bit 1 and b == 2 is bit 1. */
static Py_ssize_t split_flags(const uint8_t *restrict f, uint8_t *restrict loss,
                              uint8_t *restrict turn, Py_ssize_t n)
{
    uint64_t seen = 0;
    Py_ssize_t turns = 0, i = 0;
    while (i + 8 <= n) {
        const Py_ssize_t stop = n - i < 8 * 255 ? n : i + 8 * 255;  /* a byte lane counts 255 */
        uint64_t lanes = 0;
        for (; i + 8 <= stop; i += 8) {
            uint64_t w, t, l;
            memcpy(&w, f + i, 8);
            seen |= w;
            t = (w >> 1) & ONES;
            l = (w | (w >> 1)) & ONES;
            memcpy(turn + i, &t, 8);
            memcpy(loss + i, &l, 8);
            lanes += t;
        }
        lanes = (lanes & 0x00ff00ff00ff00ffULL) + ((lanes >> 8) & 0x00ff00ff00ff00ffULL);
        turns += (Py_ssize_t)((lanes * 0x0001000100010001ULL) >> 48);
    }
    uint8_t over = (seen & 0xfcfcfcfcfcfcfcfcULL) != 0;
    for (; i < n; i++) {
        const uint8_t b = f[i];
        over |= b > 2;
        loss[i] = b != 0;
        turn[i] = b == 2;
        turns += b == 2;
    }
    return over ? -1 : turns;
}

/* flags[i] = loss[i] + turn[i]; 0 when a turn end lies outside loss_mask. */
static int join_flags(const uint8_t *restrict l, const uint8_t *restrict t, uint8_t *restrict f,
                      Py_ssize_t n)
{
    uint8_t stray = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t a = l[i] != 0, b = t[i] != 0;
        stray |= b & !a;
        f[i] = a + b;
    }
    return !stray;
}

static PyObject *pack(PyObject *module, PyObject *args)
{
    Py_buffer loss, turn;
    if (!PyArg_ParseTuple(args, "y*y*:pack", &loss, &turn))
        return NULL;
    PyObject *out = NULL;
    if (loss.len == turn.len) {
        out = PyBytes_FromStringAndSize(NULL, loss.len);
        uint8_t *flags = out == NULL ? NULL : (uint8_t *)PyBytes_AS_STRING(out);
        if (flags != NULL && !join_flags(loss.buf, turn.buf, flags, loss.len))
            Py_SETREF(out, Py_NewRef(Py_None));
    } else {
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&loss);
    PyBuffer_Release(&turn);
    return out;
}

/* ---- the fields by name -------------------------------------------------------------------- */

/* A Trajectory's fields in its order (transport/schema.py), interned once. */
enum {
    RUN_ID, ACTOR_ID, EPISODE_ID, ENV_NAME, SEED, GROUP_ID, TOKEN_IDS, LOSS_MASK, TURN_END,
    LOGPROBS, VERSIONS, REWARDS, FINAL_REWARD, GROUP_SIZE, IMAGES, METRICS, CREATED_AT,
    SCHEMA_VERSION, FLAGS, DICT, N_NAMES
};
static const char *const NAMES[N_NAMES] = {
    "run_id", "actor_id", "episode_id", "env_name", "seed", "group_id", "token_ids", "loss_mask",
    "turn_end", "behaviour_logprobs", "policy_version", "turn_rewards", "final_reward",
    "group_size", "images", "metrics", "created_at", "schema_version", "flags", "__dict__"};
static PyObject *names[N_NAMES];
static PyObject *no_args;

/* ---- columns and trajectory: the receiver's arrays and objects ----------------------------- */

enum { BAD_FLAG = -1, NON_FINITE = -2, TOO_LONG = -3, BAD_LENGTHS = -4 };

/* A read-only 1-D array of n items of `type` over `data`, which `owner` keeps alive. */
static PyObject *view(PyObject *owner, void *data, npy_intp n, int type)
{
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(type), 1, &n,
                                         NULL, data, 0, NULL);
    if (arr != NULL && PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(owner)) < 0)
        Py_CLEAR(arr);
    return arr;
}

/* The six arrays of the five wire fields (flags, token_ids, logprobs, versions, rewards) into
 * out[] (new references): 0; or 1 with *invalid = BAD_FLAG, NON_FINITE, BAD_LENGTHS (the four
 * lengths against the flags) or the number of turn ends the rewards do not match, TOO_LONG past
 * max_tokens; -1 on an error raised. */
static int make_columns(PyObject *const *fields, Py_ssize_t max_tokens, PyObject **out,
                        Py_ssize_t *invalid)
{
    Py_buffer b[5];
    PyObject *owners[5] = {NULL, NULL, NULL, NULL, NULL};
    int got = 0, rc = -1;
    for (; got < 5; got++) {
        /* A view's owner keeps its memory in place: a memoryview or bytes as they are, anything
         * else (a bytearray could be resized) through a memoryview of its own. */
        PyObject *arg = fields[got];
        owners[got] = PyMemoryView_Check(arg) || PyBytes_CheckExact(arg)
                          ? Py_NewRef(arg) : PyMemoryView_FromObject(arg);
        if (owners[got] == NULL
            || PyObject_GetBuffer(owners[got], &b[got], PyBUF_C_CONTIGUOUS) < 0) {
            Py_XDECREF(owners[got]);
            goto done;
        }
    }
    const npy_intp n = b[0].len, turns_max = b[4].len / 4;
    rc = 1;
    if (n > max_tokens) {
        *invalid = TOO_LONG;
        goto done;
    }
    if (b[1].len != 4 * n || b[2].len != 4 * n || b[3].len != 4 * n || b[4].len % 4 != 0) {
        *invalid = BAD_LENGTHS;
        goto done;
    }
    PyObject *loss = PyArray_SimpleNew(1, (npy_intp *)&n, NPY_BOOL);
    PyObject *turn = loss == NULL ? NULL : PyArray_SimpleNew(1, (npy_intp *)&n, NPY_BOOL);
    if (turn == NULL) {
        Py_XDECREF(loss);
        rc = -1;
        goto done;
    }
    Py_ssize_t turns = split_flags(b[0].buf, PyArray_DATA((PyArrayObject *)loss),
                                   PyArray_DATA((PyArrayObject *)turn), n);
    if (turns >= 0 && (any_non_finite(b[2].buf, n) || any_non_finite(b[4].buf, turns_max)))
        turns = NON_FINITE;
    if (turns < 0 || turns != turns_max) {
        Py_DECREF(loss);
        Py_DECREF(turn);
        *invalid = turns;
        goto done;
    }
    out[1] = loss;
    out[2] = turn;
    out[0] = view(owners[1], b[1].buf, n, NPY_INT32);
    out[3] = out[0] ? view(owners[2], b[2].buf, n, NPY_FLOAT32) : NULL;
    out[4] = out[3] ? view(owners[3], b[3].buf, n, NPY_INT32) : NULL;
    out[5] = out[4] ? view(owners[4], b[4].buf, turns_max, NPY_FLOAT32) : NULL;
    rc = 0;
    if (out[5] == NULL) {
        for (int i = 0; i < 6; i++)
            Py_CLEAR(out[i]);
        rc = -1;
    }
done:
    for (int i = 0; i < got; i++) {
        PyBuffer_Release(&b[i]);
        Py_DECREF(owners[i]);
    }
    return rc;
}

static PyObject *columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "columns(flags, token_ids, logprobs, versions, rewards)");
        return NULL;
    }
    PyObject *out[6] = {NULL};
    Py_ssize_t invalid = 0;
    const int rc = make_columns(args, PY_SSIZE_T_MAX, out, &invalid);
    if (rc < 0)
        return NULL;
    if (rc == 0) {
        PyObject *tuple = PyTuple_New(6);
        for (int i = 0; i < 6; i++) {
            if (tuple != NULL)
                PyTuple_SET_ITEM(tuple, i, out[i]);  /* steals */
            else
                Py_DECREF(out[i]);
        }
        return tuple;
    }
    if (invalid == BAD_LENGTHS) {
        PyErr_Format(PyExc_ValueError, "columns: %zd flags need 4 bytes a flag in each column",
                     PyObject_Length(args[0]));
        return NULL;
    }
    return PyLong_FromSsize_t(invalid);
}

/* trajectory(cls, image_cls, msg, max_tokens): the Trajectory `cls` of a decoded message (the
 * fields of transport/schema.py's _WireTrajectory), its arrays made and checked by
 * make_columns, or the int saying why it is invalid. Its images are image_cls(png, height,
 * width). The caller has checked the schema version. */
static PyObject *trajectory(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "trajectory(cls, image_cls, msg, max_tokens)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *image_cls = args[1], *msg = args[2];
    const Py_ssize_t max_tokens = PyLong_AsSsize_t(args[3]);
    if (max_tokens == -1 && PyErr_Occurred())
        return NULL;
    static const int wire_order[5] = {FLAGS, TOKEN_IDS, LOGPROBS, VERSIONS, REWARDS};
    PyObject *fields[5] = {NULL}, *arrays[6] = {NULL}, *self = NULL, *value = NULL;
    int got = 0;
    for (; got < 5; got++)
        if ((fields[got] = PyObject_GetAttr(msg, names[wire_order[got]])) == NULL)
            goto done;
    Py_ssize_t invalid = 0;
    const int rc = make_columns(fields, max_tokens, arrays, &invalid);
    if (rc != 0) {
        self = rc < 0 ? NULL : PyLong_FromSsize_t(invalid);
        goto done;
    }
    /* Built from checked fields: cls.__new__(cls), then each field in the dataclass's order. */
    if ((self = cls->tp_new(cls, no_args, NULL)) == NULL)
        goto done;
    for (int name = RUN_ID; name <= SCHEMA_VERSION; name++) {
        if (name >= TOKEN_IDS && name <= REWARDS) {
            value = Py_NewRef(arrays[name - TOKEN_IDS]);
        } else if ((value = PyObject_GetAttr(msg, names[name])) == NULL) {
            Py_CLEAR(self);
            goto done;
        }
        if (name == IMAGES) {  /* a list of _WireImage: one of image_cls each */
            PyObject *images = PyList_New(PyList_GET_SIZE(value));
            for (Py_ssize_t i = 0; images != NULL && i < PyList_GET_SIZE(value); i++) {
                PyObject *w = PyList_GET_ITEM(value, i), *png, *height, *width, *image = NULL;
                png = PyObject_GetAttrString(w, "png");
                height = png ? PyObject_GetAttrString(w, "height") : NULL;
                width = height ? PyObject_GetAttrString(w, "width") : NULL;
                if (width != NULL)
                    image = PyObject_CallFunctionObjArgs(image_cls, png, height, width, NULL);
                Py_XDECREF(png);
                Py_XDECREF(height);
                Py_XDECREF(width);
                if (image == NULL)
                    Py_CLEAR(images);
                else
                    PyList_SET_ITEM(images, i, image);
            }
            Py_SETREF(value, images);
        }
        if (value == NULL || PyObject_SetAttr(self, names[name], value) < 0) {
            Py_CLEAR(self);
            goto done;
        }
        Py_CLEAR(value);
    }
done:
    Py_XDECREF(value);
    for (int i = 0; i < got; i++)
        Py_DECREF(fields[i]);
    for (int i = 0; i < 6; i++)
        Py_XDECREF(arrays[i]);
    return self;
}

/* ---- encode_into: the sender's msgpack ---------------------------------------------------- */

/* Output is written in two passes: with p NULL to count the bytes, then for real. */
typedef struct {
    uint8_t *p;
    Py_ssize_t n;
} Out;

static void put(Out *o, const void *src, Py_ssize_t k)
{
    if (o->p != NULL)
        memcpy(o->p + o->n, src, k);
    o->n += k;
}

static void put_byte(Out *o, uint8_t b) { put(o, &b, 1); }

/* A marker byte and the big-endian `size` bytes of v. */
static void put_be(Out *o, uint8_t marker, uint64_t v, int size)
{
    uint8_t b[9] = {marker};
    for (int i = 0; i < size; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (size - 1 - i)));
    put(o, b, 1 + size);
}

static void put_int(Out *o, int64_t v)  /* msgpack's shortest form, as msgspec writes it */
{
    if (v >= 0) {
        if (v < 128) put_byte(o, (uint8_t)v);
        else if (v < (1 << 8)) put_be(o, 0xcc, (uint64_t)v, 1);
        else if (v < (1 << 16)) put_be(o, 0xcd, (uint64_t)v, 2);
        else if (v < (1LL << 32)) put_be(o, 0xce, (uint64_t)v, 4);
        else put_be(o, 0xcf, (uint64_t)v, 8);
    } else {
        if (v >= -32) put_byte(o, (uint8_t)(0xe0 | (v + 32)));
        else if (v >= -(1 << 7)) put_be(o, 0xd0, (uint64_t)v, 1);
        else if (v >= -(1 << 15)) put_be(o, 0xd1, (uint64_t)v, 2);
        else if (v >= -(1LL << 31)) put_be(o, 0xd2, (uint64_t)v, 4);
        else put_be(o, 0xd3, (uint64_t)v, 8);
    }
}

static void put_float(Out *o, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    put_be(o, 0xcb, bits, 8);
}

/* The header of a str (fix 0xa0, 0xd9), bin (-, 0xc4), array (0x90, 0xdc) or map (0x80, 0xde). */
static void put_str_head(Out *o, Py_ssize_t n)
{
    if (n < 32) put_byte(o, (uint8_t)(0xa0 | n));
    else if (n < (1 << 8)) put_be(o, 0xd9, (uint64_t)n, 1);
    else if (n < (1 << 16)) put_be(o, 0xda, (uint64_t)n, 2);
    else put_be(o, 0xdb, (uint64_t)n, 4);
}

static void put_bin(Out *o, const void *data, Py_ssize_t n)
{
    if (n < (1 << 8)) put_be(o, 0xc4, (uint64_t)n, 1);
    else if (n < (1 << 16)) put_be(o, 0xc5, (uint64_t)n, 2);
    else put_be(o, 0xc6, (uint64_t)n, 4);
    if (data != NULL)
        put(o, data, n);
    else
        o->n += n;  /* left for the caller to fill */
}

static void put_container_head(Out *o, Py_ssize_t n, uint8_t fix, uint8_t marker16)
{
    if (n < 16) put_byte(o, (uint8_t)(fix | n));
    else if (n < (1 << 16)) put_be(o, marker16, (uint64_t)n, 2);
    else put_be(o, (uint8_t)(marker16 + 1), (uint64_t)n, 4);
}

/* A plain str, int, float, bool or bytes; 0 for another type, an int beyond 64 bits or a str
 * that is not valid UTF-8 (msgspec's path then says what is wrong). */
static int put_value(Out *o, PyObject *v)
{
    if (PyBool_Check(v)) {
        put_byte(o, v == Py_True ? 0xc3 : 0xc2);
    } else if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow != 0 || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        put_int(o, x);
    } else if (PyFloat_CheckExact(v)) {
        put_float(o, PyFloat_AS_DOUBLE(v));
    } else if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) {
            PyErr_Clear();
            return 0;
        }
        put_str_head(o, n);
        put(o, s, n);
    } else if (PyBytes_CheckExact(v)) {
        put_bin(o, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    } else {
        return 0;
    }
    return 1;
}

/* A dict of str keys and plain values (put_value), in its order; 0 off that path. */
static int put_dict(Out *o, PyObject *d)
{
    if (!PyDict_CheckExact(d))
        return 0;
    put_container_head(o, PyDict_GET_SIZE(d), 0x80, 0xde);
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
        if (!PyUnicode_CheckExact(k) || !put_value(o, k) || !put_value(o, v))
            return 0;
    return 1;
}

/* The wire's keys in their order (transport/schema.py's _wire_fields): a field, or the flags. */
static const int WIRE_ORDER[] = {SCHEMA_VERSION, RUN_ID, ACTOR_ID, EPISODE_ID, ENV_NAME, SEED,
                                 GROUP_ID, TOKEN_IDS, FLAGS, LOGPROBS, VERSIONS, REWARDS,
                                 FINAL_REWARD, GROUP_SIZE, IMAGES, METRICS, CREATED_AT};
enum { N_WIRE = sizeof(WIRE_ORDER) / sizeof(WIRE_ORDER[0]) };

typedef struct {
    PyObject *v[N_NAMES];  /* the trajectory's attributes, by name */
    Py_ssize_t n;  /* tokens */
} Fields;

/* The 1-D, C-contiguous, native-order array of `type` that `a` is, or NULL. */
static PyArrayObject *array_of(PyObject *a, int type)
{
    if (!PyArray_Check(a))
        return NULL;
    PyArrayObject *arr = (PyArrayObject *)a;
    return PyArray_NDIM(arr) == 1 && PyArray_TYPE(arr) == type && PyArray_ISNOTSWAPPED(arr)
           && PyArray_IS_C_CONTIGUOUS(arr) ? arr : NULL;
}

static int is_array(Fields *f, int name, int type, Py_ssize_t n)
{
    PyArrayObject *arr = array_of(f->v[name], type);
    return arr != NULL && (n < 0 || PyArray_DIM(arr, 0) == n);
}

/* Everything but the flags' bytes, which start at *flags_at; 0 off the common path. */
static int put_trajectory(Out *o, Fields *f, Py_ssize_t *flags_at)
{
    put_container_head(o, N_WIRE, 0x80, 0xde);
    for (int i = 0; i < N_WIRE; i++) {
        const int name = WIRE_ORDER[i];
        PyObject *v = f->v[name];
        Py_ssize_t n;
        const char *key = PyUnicode_AsUTF8AndSize(names[name], &n);
        put_str_head(o, n);
        put(o, key, n);
        switch (name) {
        case RUN_ID: case ENV_NAME:
            if (!PyUnicode_CheckExact(v) || !put_value(o, v))
                return 0;
            break;
        case FINAL_REWARD: case CREATED_AT:
            if (!PyFloat_CheckExact(v))
                return 0;
            put_float(o, PyFloat_AS_DOUBLE(v));
            break;
        case TOKEN_IDS: case LOGPROBS: case VERSIONS: case REWARDS: {
            PyArrayObject *arr = (PyArrayObject *)v;  /* checked by read_fields */
            put_bin(o, PyArray_DATA(arr), PyArray_NBYTES(arr));
            break;
        }
        case FLAGS:
            put_bin(o, NULL, f->n);
            *flags_at = o->n - f->n;
            break;
        case IMAGES:
            if (!PyList_CheckExact(v))
                return 0;
            put_container_head(o, PyList_GET_SIZE(v), 0x90, 0xdc);
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(v); k++) {
                PyObject *dict = PyObject_GetAttr(PyList_GET_ITEM(v, k), names[DICT]);
                const int ok = dict != NULL && put_dict(o, dict);  /* vars(image), as msgspec's */
                Py_XDECREF(dict);
                if (!ok) {
                    PyErr_Clear();
                    return 0;
                }
            }
            break;
        case METRICS:
            if (!put_dict(o, v))
                return 0;
            break;
        default:  /* the ints */
            if (!PyLong_CheckExact(v) || !put_value(o, v))
                return 0;
        }
    }
    return 1;
}

/* 1 with every field read (new references); 0 with an array off the common path; -1 on an
 * error raised (a missing attribute). */
static int read_fields(PyObject *t, Fields *f)
{
    for (int name = RUN_ID; name <= SCHEMA_VERSION; name++)
        if ((f->v[name] = PyObject_GetAttr(t, names[name])) == NULL)
            return -1;
    PyArrayObject *ids = array_of(f->v[TOKEN_IDS], NPY_INT32);
    if (ids == NULL)
        return 0;
    f->n = PyArray_DIM(ids, 0);
    return is_array(f, LOSS_MASK, NPY_BOOL, f->n) && is_array(f, TURN_END, NPY_BOOL, f->n)
           && is_array(f, LOGPROBS, NPY_FLOAT32, f->n) && is_array(f, VERSIONS, NPY_INT32, f->n)
           && is_array(f, REWARDS, NPY_FLOAT32, -1);
}

static PyObject *encode_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyByteArray_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_into(trajectory, buffer: bytearray)");
        return NULL;
    }
    Fields f = {{NULL}, 0};
    int ok = read_fields(args[0], &f);
    if (ok > 0) {
        Out size = {NULL, 0};
        Py_ssize_t flags_at = 0;
        ok = put_trajectory(&size, &f, &flags_at);
        if (ok && PyByteArray_Resize(args[1], size.n) < 0)
            ok = -1;
        if (ok > 0) {  /* the same pass, writing: no Python code ran between, nothing changed */
            Out out = {(uint8_t *)PyByteArray_AS_STRING(args[1]), 0};
            put_trajectory(&out, &f, &flags_at);
            ok = join_flags(PyArray_DATA((PyArrayObject *)f.v[LOSS_MASK]),
                            PyArray_DATA((PyArrayObject *)f.v[TURN_END]), out.p + flags_at, f.n);
        }
    }
    for (int i = 0; i < N_NAMES; i++)
        Py_XDECREF(f.v[i]);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "flags = loss_mask + turn_end as bytes; None if they disagree."},
    {"columns", (PyCFunction)(void (*)(void))columns, METH_FASTCALL,
     "A received trajectory's six per-token arrays, or an int saying why it is invalid."},
    {"trajectory", (PyCFunction)(void (*)(void))trajectory, METH_FASTCALL,
     "The Trajectory of a decoded message, or an int saying why it is invalid."},
    {"encode_into", (PyCFunction)(void (*)(void))encode_into, METH_FASTCALL,
     "The trajectory's msgpack over a bytearray; False where msgspec's path must encode it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire",
    "A trajectory's wire form in compiled code (transport/wire.py).", 0, methods,
};

PyMODINIT_FUNC PyInit__wire(void)
{
    import_array();
    for (int i = 0; i < N_NAMES; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return NULL;
    if (no_args == NULL && (no_args = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
