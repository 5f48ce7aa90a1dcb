/* fsync off the event loop without the interpreter lock (broker/storage/fsync_worker.py).
 *
 * A log's flush round hands its file descriptors here. POSIX threads of this module fsync and close
 * them and, when asked, fsync a directory; each finished job is queued with its first errno, and an
 * eventfd the event loop watches is bumped. No step takes the GIL: a thread pool of Python workers
 * waits for the GIL after every fsync and close, which on a busy two-core machine costs more than the
 * fsync itself (its wake-up waits for the loop to pause).
 *
 * FsyncWorker(threads) -> worker
 * worker.submit(token, fds, directory)  fds: a sequence of ints the worker owns (closes) from now on;
 *                                       directory: a path (bytes) to fsync after them, or None
 * worker.fileno()                       the eventfd; readable once a job finished
 * worker.completed()                    [(token, errno), ...] of the jobs finished since the last call
 * worker.close()                        joins the threads; jobs not started are closed, not fsynced
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_THREADS 16

typedef struct job {
    struct job *next;
    unsigned long long token;
    int error;
    Py_ssize_t nfds;
    char *directory; /* NULL: no directory fsync */
    int fds[];
} job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t ready;
    job *queue_head, *queue_tail; /* waiting to run */
    job *done;                    /* finished, newest first */
    int event_fd;
    int stopping;
    int nthreads;
    pthread_t threads[MAX_THREADS];
} FsyncWorker;

static void
run_job(job *j)
{
    for (Py_ssize_t i = 0; i < j->nfds; i++) {
        if (j->error == 0 && fsync(j->fds[i]) != 0)
            j->error = errno;
        close(j->fds[i]);
    }
    if (j->directory != NULL && j->error == 0) {
        int fd = open(j->directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            j->error = errno;
        } else {
            if (fsync(fd) != 0)
                j->error = errno;
            close(fd);
        }
    }
}

static void
free_job(job *j)
{
    free(j->directory);
    free(j);
}

static void *
worker_main(void *arg)
{
    FsyncWorker *self = (FsyncWorker *)arg;
    for (;;) {
        pthread_mutex_lock(&self->lock);
        while (self->queue_head == NULL && !self->stopping)
            pthread_cond_wait(&self->ready, &self->lock);
        if (self->queue_head == NULL) { /* stopping, nothing left */
            pthread_mutex_unlock(&self->lock);
            return NULL;
        }
        job *j = self->queue_head;
        self->queue_head = j->next;
        if (self->queue_head == NULL)
            self->queue_tail = NULL;
        pthread_mutex_unlock(&self->lock);

        run_job(j);

        pthread_mutex_lock(&self->lock);
        j->next = self->done;
        self->done = j;
        pthread_mutex_unlock(&self->lock);
        uint64_t one = 1;
        while (write(self->event_fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
    }
}

static void
stop_threads(FsyncWorker *self)
{
    if (self->nthreads == 0)
        return;
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_cond_broadcast(&self->ready);
    pthread_mutex_unlock(&self->lock);
    int n = self->nthreads;
    self->nthreads = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n; i++)
        pthread_join(self->threads[i], NULL);
    Py_END_ALLOW_THREADS
}

static int
FsyncWorker_init(FsyncWorker *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", NULL};
    int threads = 4;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i", kwlist, &threads))
        return -1;
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d", MAX_THREADS);
        return -1;
    }
    if (self->event_fd >= 0 || self->nthreads > 0) {
        PyErr_SetString(PyExc_RuntimeError, "FsyncWorker already initialised");
        return -1;
    }
    self->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->event_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&self->threads[i], NULL, worker_main, self);
        if (rc != 0) {
            stop_threads(self);
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        self->nthreads = i + 1;
    }
    return 0;
}

static PyObject *
FsyncWorker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    FsyncWorker *self = (FsyncWorker *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->ready, NULL);
    self->event_fd = -1;
    return (PyObject *)self;
}

static void
release_all(FsyncWorker *self)
{
    stop_threads(self);
    /* Jobs never started still own their descriptors. */
    for (job *j = self->queue_head; j != NULL;) {
        job *next = j->next;
        for (Py_ssize_t i = 0; i < j->nfds; i++)
            close(j->fds[i]);
        free_job(j);
        j = next;
    }
    self->queue_head = self->queue_tail = NULL;
    for (job *j = self->done; j != NULL;) {
        job *next = j->next;
        free_job(j);
        j = next;
    }
    self->done = NULL;
    if (self->event_fd >= 0) {
        close(self->event_fd);
        self->event_fd = -1;
    }
}

static void
FsyncWorker_dealloc(FsyncWorker *self)
{
    release_all(self);
    pthread_mutex_destroy(&self->lock);
    pthread_cond_destroy(&self->ready);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
FsyncWorker_submit(FsyncWorker *self, PyObject *args)
{
    unsigned long long token;
    PyObject *fds_obj, *dir_obj;
    if (!PyArg_ParseTuple(args, "KOO", &token, &fds_obj, &dir_obj))
        return NULL;
    if (self->nthreads == 0) {
        PyErr_SetString(PyExc_RuntimeError, "FsyncWorker is closed");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(fds_obj, "fds must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    job *j = calloc(1, sizeof(job) + (size_t)n * sizeof(int));
    if (j == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(j);
            return NULL;
        }
        j->fds[i] = (int)fd;
    }
    Py_DECREF(seq);
    j->nfds = n;
    j->token = token;
    if (dir_obj != Py_None) {
        char *path;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(dir_obj, &path, &len) < 0) {
            free(j);
            return NULL;
        }
        j->directory = strdup(path);
        if (j->directory == NULL) {
            free(j);
            return PyErr_NoMemory();
        }
    }
    pthread_mutex_lock(&self->lock);
    if (self->queue_tail != NULL)
        self->queue_tail->next = j;
    else
        self->queue_head = j;
    self->queue_tail = j;
    pthread_cond_signal(&self->ready);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyObject *
FsyncWorker_completed(FsyncWorker *self, PyObject *Py_UNUSED(ignored))
{
    uint64_t count;
    if (self->event_fd >= 0)
        while (read(self->event_fd, &count, sizeof count) < 0 && errno == EINTR)
            ;
    pthread_mutex_lock(&self->lock);
    job *done = self->done;
    self->done = NULL;
    pthread_mutex_unlock(&self->lock);
    PyObject *result = PyList_New(0);
    for (job *j = done; j != NULL;) {
        job *next = j->next;
        if (result != NULL) {
            PyObject *item = Py_BuildValue("(Ki)", j->token, j->error);
            if (item == NULL || PyList_Append(result, item) < 0)
                Py_CLEAR(result);
            Py_XDECREF(item);
        }
        free_job(j);
        j = next;
    }
    return result;
}

static PyObject *
FsyncWorker_fileno(FsyncWorker *self, PyObject *Py_UNUSED(ignored))
{
    if (self->event_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "FsyncWorker is closed");
        return NULL;
    }
    return PyLong_FromLong(self->event_fd);
}

static PyObject *
FsyncWorker_close(FsyncWorker *self, PyObject *Py_UNUSED(ignored))
{
    release_all(self);
    Py_RETURN_NONE;
}

static PyMethodDef FsyncWorker_methods[] = {
    {"submit", (PyCFunction)FsyncWorker_submit, METH_VARARGS,
     "submit(token, fds, directory): fsync and close fds, then fsync directory (bytes) unless None."},
    {"completed", (PyCFunction)FsyncWorker_completed, METH_NOARGS,
     "completed() -> [(token, errno)] of the jobs finished since the last call."},
    {"fileno", (PyCFunction)FsyncWorker_fileno, METH_NOARGS, "The eventfd that is readable once a job finished."},
    {"close", (PyCFunction)FsyncWorker_close, METH_NOARGS, "Join the threads and close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FsyncWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.broker.storage._fsync_worker.FsyncWorker",
    .tp_basicsize = sizeof(FsyncWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "POSIX threads that fsync and close descriptors without the GIL.",
    .tp_new = FsyncWorker_new,
    .tp_init = (initproc)FsyncWorker_init,
    .tp_dealloc = (destructor)FsyncWorker_dealloc,
    .tp_methods = FsyncWorker_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fsync_worker", "fsync off the event loop without the GIL.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__fsync_worker(void)
{
    if (PyType_Ready(&FsyncWorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FsyncWorkerType);
    if (PyModule_AddObject(m, "FsyncWorker", (PyObject *)&FsyncWorkerType) < 0) {
        Py_DECREF(&FsyncWorkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
