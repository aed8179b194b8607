/* The per-token flags byte of a trajectory on the wire, in one pass each way (transport/flags.py
 * says what it is for and holds the numpy version these must equal).
 *
 *   pack(loss_mask, turn_end) -> bytes | None
 *       flags[i] = loss_mask[i] + turn_end[i]; None when a turn end lies outside loss_mask or
 *       the two lengths differ.
 *   unpack(flags, logprobs, rewards, masks) -> int
 *       writes loss_mask (flags != 0) into masks[:n] and turn_end (flags == 2) into masks[n:],
 *       and returns the number of turn ends; -1 when a flag is above 2, -2 when a log-prob or a
 *       reward is not finite. Raises ValueError when the buffers' sizes disagree (the caller
 *       checks them first: this keeps a wrong call from reading or writing out of bounds).
 *
 * Buffers are any C-contiguous bytes-like objects; logprobs and rewards are float32, read bytewise
 * (a msgpack payload does not align them), so a non-finite value is one whose exponent bits are
 * all ones. The loops are branch-free so that the compiler vectorises them.
 */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "the wire's floats are little-endian: on this host transport/flags.py's numpy path runs"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

static PyObject *pack(PyObject *module, PyObject *args)
{
    Py_buffer loss, turn;
    if (!PyArg_ParseTuple(args, "y*y*:pack", &loss, &turn))
        return NULL;
    PyObject *out = NULL;
    if (loss.len == turn.len) {
        out = PyBytes_FromStringAndSize(NULL, loss.len);
        if (out != NULL) {
            const uint8_t *restrict l = loss.buf, *restrict t = turn.buf;
            uint8_t *restrict f = (uint8_t *)PyBytes_AS_STRING(out);
            uint8_t stray = 0;
            const Py_ssize_t n = loss.len;
            for (Py_ssize_t i = 0; i < n; i++) {
                uint8_t a = l[i] != 0, b = t[i] != 0;
                stray |= b & !a;
                f[i] = a + b;
            }
            if (stray) {
                Py_SETREF(out, Py_NewRef(Py_None));
            }
        }
    } else {
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&loss);
    PyBuffer_Release(&turn);
    return out;
}

static PyObject *unpack(PyObject *module, PyObject *args)
{
    Py_buffer flags, logprobs, rewards, masks;
    if (!PyArg_ParseTuple(args, "y*y*y*w*:unpack", &flags, &logprobs, &rewards, &masks))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = flags.len;
    if (logprobs.len != 4 * n || rewards.len % 4 != 0 || masks.len != 2 * n) {
        PyErr_Format(PyExc_ValueError,
                     "unpack: %zd flags need %zd bytes of log-probs and %zd of masks, got %zd "
                     "and %zd (and rewards of a multiple of 4 bytes, got %zd)",
                     n, 4 * n, 2 * n, logprobs.len, masks.len, rewards.len);
        goto done;
    }
    const uint8_t *restrict f = flags.buf;
    uint8_t *restrict loss = masks.buf, *restrict turn = loss + n;
    uint8_t over = 0;
    Py_ssize_t turns = 0;
    for (Py_ssize_t start = 0; start < n; start += 240) {  /* a byte counts up to 240 turn ends */
        const Py_ssize_t stop = n - start < 240 ? n : start + 240;
        uint8_t chunk_turns = 0;
        for (Py_ssize_t i = start; i < stop; i++) {
            uint8_t b = f[i];
            over |= b > 2;
            loss[i] = b != 0;
            turn[i] = b == 2;
            chunk_turns += b == 2;
        }
        turns += chunk_turns;
    }
    if (over)
        turns = -1;
    else if (any_non_finite(logprobs.buf, n) || any_non_finite(rewards.buf, rewards.len / 4))
        turns = -2;
    out = PyLong_FromSsize_t(turns);
done:
    PyBuffer_Release(&flags);
    PyBuffer_Release(&logprobs);
    PyBuffer_Release(&rewards);
    PyBuffer_Release(&masks);
    return out;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "flags = loss_mask + turn_end as bytes; None if they disagree."},
    {"unpack", unpack, METH_VARARGS,
     "Write loss_mask and turn_end into masks; the number of turn ends, -1 or -2 if invalid."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_flags", "The trajectory's flags byte (transport/flags.py).", 0, methods,
};

PyMODINIT_FUNC PyInit__flags(void)
{
    return PyModule_Create(&module);
}
