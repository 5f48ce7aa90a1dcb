/* The produce-time record walk of protocol/records.py (`_walk_records`), compiled.
 *
 * walk(data, count, require_keys) checks that `count` v2 records exactly fill `data`: each record's
 * length, key/value/header framing, offset deltas 0..count-1 and, with require_keys, a key on every
 * record. It returns (smallest, largest) timestamp delta when the batch passes, and None otherwise:
 * the caller then runs the Python walk, which finds the same fault and words the error. So this module
 * only has to be sure about acceptance; it also answers None for varints of ten bytes (values that may
 * not fit 64 bits), which the Python walk handles with unbounded integers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A zigzag varint of at most 9 bytes within [*pos, end); 0 on success, -1 otherwise. */
static inline int
read_zz(const uint8_t *d, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    Py_ssize_t p = *pos;
    uint64_t u = 0;
    for (int shift = 0; shift < 63; shift += 7) {
        if (p >= end)
            return -1;
        uint8_t b = d[p++];
        u |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
            *pos = p;
            return 0;
        }
    }
    return -1;
}

/* Skip `size` bytes (a length of -1 or 0 skips nothing) without passing `end`. */
static inline int
skip(Py_ssize_t *pos, Py_ssize_t end, int64_t size)
{
    if (size > 0) {
        if (size > (int64_t)(end - *pos))
            return -1;
        *pos += (Py_ssize_t)size;
    }
    return 0;
}

/* 0 and the deltas when every record is well framed; -1 at the first doubt. */
static int
walk_records(const uint8_t *d, Py_ssize_t end, Py_ssize_t count, int require_keys, int64_t *min_out,
             int64_t *max_out)
{
    Py_ssize_t pos = 0;
    int64_t min_delta = 0, max_delta = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        int64_t length, delta, offset_delta, key_size, value_size, header_count;
        if (read_zz(d, &pos, end, &length) < 0)
            return -1;
        if (length <= 0 || length > (int64_t)(end - pos))
            return -1;
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes: unused in v2 records */
        if (read_zz(d, &pos, record_end, &delta) < 0)
            return -1;
        if (index == 0) {
            min_delta = max_delta = delta;
        } else if (delta < min_delta) {
            min_delta = delta;
        } else if (delta > max_delta) {
            max_delta = delta;
        }
        if (read_zz(d, &pos, record_end, &offset_delta) < 0 || offset_delta != (int64_t)index)
            return -1;
        if (read_zz(d, &pos, record_end, &key_size) < 0 || key_size < -1 || (require_keys && key_size < 0)
            || skip(&pos, record_end, key_size) < 0)
            return -1;
        if (read_zz(d, &pos, record_end, &value_size) < 0 || value_size < -1
            || skip(&pos, record_end, value_size) < 0)
            return -1;
        if (read_zz(d, &pos, record_end, &header_count) < 0)
            return -1;
        /* Each header takes at least two bytes (two length varints). */
        if (header_count < 0 || header_count > (int64_t)(record_end - pos) / 2)
            return -1;
        for (int64_t h = 0; h < header_count; h++) {
            if (read_zz(d, &pos, record_end, &key_size) < 0 || key_size < 0
                || skip(&pos, record_end, key_size) < 0)
                return -1;
            if (read_zz(d, &pos, record_end, &value_size) < 0 || value_size < -1
                || skip(&pos, record_end, value_size) < 0)
                return -1;
        }
        if (pos != record_end)
            return -1;
    }
    if (pos != end)
        return -1;
    *min_out = min_delta;
    *max_out = max_delta;
    return 0;
}

static PyObject *
walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count;
    int require_keys;
    int64_t min_delta, max_delta;
    if (!PyArg_ParseTuple(args, "y*np:walk", &view, &count, &require_keys))
        return NULL;
    int rc = walk_records((const uint8_t *)view.buf, view.len, count, require_keys, &min_delta, &max_delta);
    PyBuffer_Release(&view);
    if (rc < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)min_delta, (long long)max_delta);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(data, count, require_keys) -> (min_delta, max_delta) if the records are well framed, else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_walk", "The produce-time record walk, compiled.", -1, methods,
};

PyMODINIT_FUNC
PyInit__record_walk(void)
{
    return PyModule_Create(&module);
}
