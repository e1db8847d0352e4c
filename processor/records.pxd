# Cython declarations for records.py (issue 37, docs/compiled.md): in the compiled build a Change
# is an extension type (two struct fields; no Python __init__ frame per change forwarded).

cdef class Change:
    cdef public object new, old
