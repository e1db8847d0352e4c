# Cython declarations for change_logging.py (issue 37, docs/compiled.md; see
# processor/operators/base.pxd).

cdef class ChangeLoggingStores:
    cdef dict __dict__
    cdef public object inner, unlogged, writer, _journal
    cdef public set _unlogged_open
    cdef public dict stores


cdef class ChangeLoggingStore:
    cdef dict __dict__
    cdef public object name, inner, _journal, get, range, prefix, items
    cdef public dict changes
    cdef public ChangeLoggingStores _provider

    cpdef put(self, key, value)
    cpdef delete(self, key)
