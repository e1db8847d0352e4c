# Cython declarations for dispatch.py (issue 37, docs/compiled.md; see processor/operators/base.pxd):
# the loop's containers are struct fields and the task's ``process`` is a C call.
cimport cython

from processor.engine.task cimport Task


cdef class MessageDispatch:
    cdef public object consumer, tm, fetch_gaps, stop

    @cython.locals(task=Task, n=Py_ssize_t, seen=Py_ssize_t, tasks=dict, sub_of=dict, groups=dict,
                   ordered=dict, open_gaps=dict, at_eof=set, resumed=set)
    cpdef Py_ssize_t dispatch(self, list msgs) except -1
