"""The option values and the config base of torchair's and npugraph_ex's ``CompilerConfig`` (both packages' configs).

The Ascend adapter's configs are trees of ``NpuBaseConfig`` nodes whose leaves are
``OptionValue`` objects. Assigning to a leaf checks the value against what the option
allows (``ValueError``/``TypeError`` naming the value and the allowed ones); assigning to a
name that is not an option of the node raises ``ValueError("<Class> has no option <name>,
all options [...]")``, so a misspelt option never passes silently. ``OptionValue.value`` reads
back a string (``"1"``/``"0"`` for booleans) in torchair's configs, the value itself in
npugraph_ex's (``bool_as_string=False``), as on the adapter.
"""
import os
import re

INT64_MAX = 2 ** 63 - 1


class OptionValue:
    """An option with a default and, optionally, the list of values it allows."""

    bool_as_string = True

    def __init__(self, default, optional=None):
        self.__default = default
        self.__optional = optional
        self._value = default

    def __bool__(self):
        return bool(self._value)

    def __repr__(self):
        return f"{type(self).__name__}({self._value!r})"

    @property
    def default(self):
        return self.__default

    @property
    def optional(self):
        return self.__optional

    @property
    def value(self):
        if self._value is None:
            return None
        if isinstance(self._value, bool):
            if self.bool_as_string:
                return "1" if self._value else "0"
            return self._value
        return str(self._value)

    @value.setter
    def value(self, v):
        if isinstance(self.__optional, (tuple, list)) and v not in self.__optional:
            raise ValueError(f"Value {v!r} (type: {type(v)}) not in optional list {self.__optional!r}")
        self._value = v


class IntRangeValue(OptionValue):
    def __init__(self, default, value_min, value_max):
        super().__init__(default)
        self._min, self._max = value_min, value_max

    @property
    def value(self):
        return None if self._value is None else int(self._value)

    @value.setter
    def value(self, v):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"Please set integer type, but got {type(v)}")
        if not self._min <= v <= self._max:
            raise ValueError(f"Please set value in [{self._min}, {self._max}], {v} is out of range.")
        self._value = v


class _CheckedValue(OptionValue):
    """An option read back as set (no string form): each kind checks what it is given."""

    def __init__(self, default=None):
        super().__init__(default)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        self._value = self._check(v)

    def _check(self, v):
        raise NotImplementedError


class IntListValue(_CheckedValue):
    def _check(self, v):
        if v is not None and not isinstance(v, (list, tuple)):
            raise TypeError(f"the set value must be None or list, got {type(v)}")
        v = [] if v is None else list(v)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise TypeError(f"the set value must be int list, got list type: {[type(x) for x in v]}")
        return v


class _TypedValue(_CheckedValue):
    _kind, _kind_name = object, "object"

    def _check(self, v):
        if v is not None and not isinstance(v, self._kind):
            raise TypeError(f"value must be {self._kind_name} or None, got {type(v)}")
        return v


class StrOptionValue(_TypedValue):
    _kind, _kind_name = str, "str"


class DictOptionValue(_TypedValue):
    _kind, _kind_name = dict, "dict"


class CallableValue(_CheckedValue):
    def _check(self, v):
        if v is not None and not callable(v):
            raise TypeError(f"value must be Callable or None, got {type(v)}")
        return v


class FileValue(_CheckedValue):
    def _check(self, v):
        if v is not None and not os.path.isfile(v):
            raise FileNotFoundError(f"Please set legal file path, {v} is not found or is not a file!")
        return v


class MustExistedPathValue(_CheckedValue):
    def _check(self, v):
        if v is None or not os.path.isdir(v):
            raise FileNotFoundError(f"Please set legal dir path, {v} is not found or is not a file directory!")
        return v


class RegexValue(_CheckedValue):
    def __init__(self, default, regex, example):
        super().__init__(default)
        self._regex, self._example = regex, example

    def _check(self, v):
        if not isinstance(v, str) or not re.match(self._regex, v):
            raise ValueError(f"Please set legal regex value format match {self._regex}, {v} is Illegal format, "
                             f"correct example:{self._example}.")
        return v


class NpuBaseConfig:
    """A node of a config tree: its options are the OptionValue and NpuBaseConfig attributes
    set in ``__init__`` before ``super().__init__()`` (plus names added to ``_fixed_attrs``)."""

    _bool_as_string = True   # torchair's OptionValue.value reads "1"/"0" for booleans; npugraph_ex's the bool

    def __init__(self):
        self._fixed_attrs = [k for k, v in self.__dict__.items() if isinstance(v, (OptionValue, NpuBaseConfig))]
        for v in self.__dict__.values():
            if isinstance(v, OptionValue):
                v.bool_as_string = self._bool_as_string

    def __setattr__(self, key, value):
        if "_fixed_attrs" in self.__dict__:
            if key not in self._fixed_attrs:
                raise ValueError(f"{type(self).__name__} has no option {key}, all options {self._fixed_attrs}")
            current = self.__dict__.get(key)   # (a property such as path is set through its setter)
            if isinstance(current, OptionValue):
                current.value = value
                return
        super().__setattr__(key, value)

    def leaves(self, prefix=""):
        """(dotted path, value) of every option below this node; OptionValues give their raw value."""
        for key in self._fixed_attrs:
            if key.startswith("_") and key[1:] in self._fixed_attrs:
                continue   # (graph_dump._path: the same option as graph_dump.path)
            item = getattr(self, key)
            if isinstance(item, NpuBaseConfig):
                yield from item.leaves(f"{prefix}{key}.")
            elif isinstance(item, OptionValue):
                yield f"{prefix}{key}", item._value
            elif hasattr(item, "__dict__") and not callable(item):
                for sub, v in vars(item).items():
                    yield f"{prefix}{key}.{sub}", v
            else:
                yield f"{prefix}{key}", item
