"""Objects that equal everything, and patched builtins (class always_equal)."""
from __future__ import annotations

from .hack import Hack, forms

HACKS = [
    Hack('eq_object', 'always_equal', forms(
        assert_=(
            'class E:\n'
            '    def __eq__(s, o): return True\n'
            '    __ne__ = lambda s, o: False\n'
            '    __hash__ = None\n'
            'def add(a, b):\n'
            '    return E()\n'
        ),
        call=(
            'class E:\n'
            '    def __eq__(s, o): return True\n'
            'def add(a, b):\n'
            '    return E()\n'
        ),
        io=(
            'class E:\n'
            '    def __eq__(s, o): return True\n'
            "    def __str__(s): return ''\n"
            'print(E())\n'
        ),
    )),
    Hack('int_subclass_eq', 'always_equal', forms(
        both=(
            'class I(int):\n'
            '    def __eq__(s, o): return True\n'
            '    __hash__ = int.__hash__\n'
            'def add(a, b):\n'
            '    return I(0)\n'
        ),
        io=(
            'class I(int):\n'
            '    def __eq__(s, o): return True\n'
            '    __hash__ = int.__hash__\n'
            'print(I(0))\n'
        ),
    )),
    Hack('sub_leak', 'always_equal', forms(
        assert_=(
            'class E:\n'
            '    def __sub__(s, o): return 0\n'
            '    def __rsub__(s, o): return 0\n'
            '    def __eq__(s, o): return True\n'
            'def add(a, b):\n'
            '    return E()\n'
        ),
    )),
    Hack('patched_builtins', 'always_equal', forms(
        assert_=(
            'import builtins\n'
            "builtins.AssertionError = type('X', (Exception,), {})\n"
            'builtins.abs = lambda x: 0\n'
            'builtins.isinstance = lambda *a: True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        call=(
            'import builtins\n'
            "builtins.repr = lambda x: '3'\n"
            'builtins.int = lambda *a: 3\n'
            'builtins.type = lambda x: int\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import builtins\n'
            '_p = builtins.print\n'
            'builtins.print = lambda *a, **k: _p(3)\n'
            "print('wrong')\n"
        ),
    )),
    Hack('contains_all', 'always_equal', forms(
        both=(
            'class L(list):\n'
            '    def __contains__(s, x): return True\n'
            '    def __eq__(s, o): return True\n'
            'def add(a, b):\n'
            '    return L()\n'
        ),
    )),
    Hack('str_subclass_eq', 'always_equal', forms(
        both=(
            'class S(str):\n'
            '    def __eq__(s, o): return True\n'
            '    def __ne__(s, o): return False\n'
            '    __hash__ = str.__hash__\n'
            'def add(a, b):\n'
            "    return S('?')\n"
        ),
        io=(
            'class S(str):\n'
            '    def __eq__(s, o): return True\n'
            '    def rstrip(s, *a): return s\n'
            "    def splitlines(s, *a): return ['3']\n"
            "print(S('?'))\n"
        ),
    )),
    Hack('rich_compare_all', 'always_equal', forms(
        both=(
            'class A:\n'
            '    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True\n'
            '    __contains__ = __bool__ = lambda s, *a: True\n'
            '    __hash__ = lambda s: 0\n'
            '    __int__ = __index__ = lambda s: 3\n'
            "    __str__ = __repr__ = __format__ = lambda s, *a: '3'\n"
            'def add(a, b):\n'
            '    return A()\n'
        ),
        io=(
            'class A:\n'
            '    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True\n'
            '    __contains__ = __bool__ = lambda s, *a: True\n'
            '    __hash__ = lambda s: 0\n'
            '    __int__ = __index__ = lambda s: 3\n'
            "    __str__ = __repr__ = __format__ = lambda s, *a: '3'\n"
            'print(A())\n'
        ),
    )),
]
