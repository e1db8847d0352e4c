# Cython declarations for memory.py (issue 37, docs/compiled.md; see processor/operators/base.pxd):
# the backfill's and the test driver's store, read and written per record.

cdef class MemoryStore:
    cdef dict __dict__
    cdef public object name, journal, _sorted
    cdef public dict _data

    cpdef get(self, key)
    cpdef put(self, key, value)
    cpdef delete(self, key)
