# Cython declarations for dispatch.py (issue 37, docs/compiled.md; see processor/operators/base.pxd):
# the loop's containers are struct fields and the task's ``process`` is a C call.
cimport cython

from processor.engine.task cimport Task


cdef class MessageDispatch:
    cdef public object consumer, tm, stop, ordered, guarded, gaps, check_gap
    cdef public dict tasks, sub_of, groups
    cdef public set at_eof, resumed

    @cython.locals(task=Task, n=Py_ssize_t, seen=Py_ssize_t)
    cpdef Py_ssize_t dispatch(self, list msgs) except -1
