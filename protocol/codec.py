"""Compiles message specs into specialised encode/decode functions, one pair per struct and version.

Walking a spec per message is slow in Python, so each (struct, version) becomes a generated function
with the field layout baked in: fixed-width runs are read and written with one precompiled
`struct.Struct`, and version checks disappear. Generated once per version, on first use.
"""

from __future__ import annotations

import keyword
import struct
from collections.abc import Callable
from typing import Any, NoReturn

from .record_batch import InvalidRecordBatch
from .records import read_uvarint, write_uvarint
from .schema import FieldSpec, MessageSpec, StructSpec

_FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
}

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


Buffer = bytes | bytearray | memoryview  # what messages are decoded from


class DecodeError(ValueError):
    """Bytes that do not form a valid message of the expected API and version."""


class SplicedBuffer(bytearray):
    """An encode buffer that keeps large record sets out of itself.

    Appending a multi-megabyte record set to a bytearray copies it, and every later small append may
    copy the whole buffer again to grow it; a fetch response of tens of MiB spent longer in that than in
    reading the log. Here a record set of at least SPLICE_MIN bytes is noted with its position instead,
    and `parts()` gives the message as a list of buffers for one vectored write.
    """

    SPLICE_MIN = 1 << 16

    def __init__(self, initial: bytes = b"") -> None:
        super().__init__(initial)
        self.splices: list[tuple[int, Buffer]] = []
        self.spliced_bytes = 0

    def parts(self) -> list[Buffer]:
        """The encoded message: this buffer's bytes with each spliced record set in its place."""
        if not self.splices:
            return [self]
        view = memoryview(self)
        out: list[Buffer] = []
        start = 0
        for position, data in self.splices:
            if position > start:
                out.append(view[start:position])
            out.append(data)
            start = position
        if start < len(self):
            out.append(view[start:])
        return out


def _write_records(out: bytearray, data: Buffer) -> None:
    """Append a record set, or splice it in when `out` is a SplicedBuffer and the set is large."""
    if isinstance(out, SplicedBuffer) and len(data) >= out.SPLICE_MIN:
        out.splices.append((len(out), data))
        out.spliced_bytes += len(data)
    else:
        out += data


def _check(buf: Buffer, end: int) -> None:
    if end > len(buf):
        raise DecodeError("message truncated")


class MessageBase:
    """Base of the generated message and struct classes: keyword construction, equality, repr."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: tuple[Any, ...] = ()
    _factories: dict[str, Callable[[], Any]] = {}

    def __init__(self, **kwargs: Any) -> None:
        for name, default in zip(self._fields, self._defaults, strict=True):
            if name in kwargs:
                value = kwargs.pop(name)
            elif name in self._factories:
                value = self._factories[name]()
            else:
                value = default
            object.__setattr__(self, name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(kwargs)}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]  # mutable messages are unhashable, as in dataclasses(eq=True)

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, Any]:
        def conv(v: Any) -> Any:
            if isinstance(v, MessageBase):
                return v.to_dict()
            if isinstance(v, list):
                return [conv(x) for x in v]
            return v

        return {f: conv(getattr(self, f)) for f in self._fields}


def bind_classes(spec: MessageSpec, root: type[MessageBase]) -> type[MessageBase]:
    """Give the generated classes of a message (`message_classes.py`) their defaults from the spec: the
    class per struct is nested in the root class, its fields are the union over all versions."""
    bound: set[str] = set()

    def bind(s: StructSpec) -> type[MessageBase]:
        cls: type[MessageBase] = root if s is spec.root else getattr(root, s.name, None) or _stale(spec, s.name)
        if s.name in bound:
            return cls
        names = tuple(f.attr for f in s.fields)
        if getattr(cls, "__slots__", None) != names:
            _stale(spec, s.name)
        factories: dict[str, Callable[[], Any]] = {}
        defaults: list[Any] = []
        for f in s.fields:
            if f.is_array and f.default is not None:
                factories[f.attr] = list
                defaults.append(None)
            elif f.struct is not None and not f.is_array:
                sub_cls = bind(f.struct)
                if f.default is None and f.nullable.low >= 0:
                    defaults.append(None)
                else:
                    factories[f.attr] = sub_cls
                    defaults.append(None)
            else:
                defaults.append(f.default)
            if f.struct is not None:
                bind(f.struct)
        cls._fields, cls._defaults, cls._factories = names, tuple(defaults), factories
        init = _compiled_init(cls, names, defaults, factories)
        if init is not None:
            cls.__init__ = init  # type: ignore[method-assign]
            cls.__eq__ = _compiled_eq(cls, names)  # type: ignore[method-assign]
        bound.add(s.name)
        return cls

    return bind(spec.root)


_MISSING: Any = object()


def _compiled_init(cls: type[MessageBase], names: tuple[str, ...], defaults: list[Any],
                   factories: dict[str, Callable[[], Any]]) -> Callable[..., None] | None:
    """A keyword-only `__init__` for the class with its fields spelled out: what MessageBase.__init__
    does, without its loop over every field and the kwargs dict (handlers build responses per request
    and per partition). None when a field name cannot be a parameter; the generic one serves then."""
    if any(not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name == "self"
           for name in names):
        return None
    ns: dict[str, Any] = {"_M": _MISSING}
    params: list[str] = []
    body: list[str] = []
    for i, (name, default) in enumerate(zip(names, defaults, strict=True)):
        if name in factories:
            ns[f"_f{i}"] = factories[name]
            params.append(f"{name}=_M")
            body.append(f"    self.{name} = _f{i}() if {name} is _M else {name}")
        else:
            ns[f"_d{i}"] = default
            params.append(f"{name}=_d{i}")
            body.append(f"    self.{name} = {name}")
    src = f"def __init__(self, *, {', '.join(params)}):\n" + ("\n".join(body) or "    pass") + "\n"
    if not params:
        src = "def __init__(self):\n    pass\n"
    exec(compile(src, f"<shoal init {cls.__qualname__}>", "exec"), ns)
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _compiled_eq(cls: type[MessageBase], names: tuple[str, ...]) -> Callable[[Any, object], bool]:
    """MessageBase.__eq__ with the fields spelled out (encoders compare tagged structs to their defaults)."""
    same = " and ".join(f"self.{name} == other.{name}" for name in names) or "True"
    src = (f"def __eq__(self, other):\n    if type(other) is not type(self):\n        return NotImplemented\n"
           f"    return {same}\n")
    ns: dict[str, Any] = {}
    exec(compile(src, f"<shoal eq {cls.__qualname__}>", "exec"), ns)
    eq: Callable[[Any, object], bool] = ns["__eq__"]
    eq.__qualname__ = f"{cls.__qualname__}.__eq__"
    return eq


def _stale(spec: MessageSpec, struct: str) -> NoReturn:
    raise RuntimeError(f"message_classes.py does not match the spec of {spec.name} ({struct}): run `make generate`")


class _Gen:
    """Emits Python source for one message version."""

    def __init__(self, spec: MessageSpec, version: int, classes: dict[str, type[MessageBase]],
                 view_records: bool = False):
        self.spec = spec
        self.version = version
        # Decode record sets as views into the buffer (a memoryview) instead of copies.
        self.view_records = view_records
        self.flexible = version in spec.flexible
        self.classes = classes
        self.ns: dict[str, Any] = {
            "_uv": read_uvarint,
            "_wuv": write_uvarint,
            "_wrec": _write_records,
            "_check": _check,
            "DecodeError": DecodeError,
            "_I16": _I16,
            "_I32": _I32,
        }
        self.lines: list[str] = []
        self.done: set[str] = set()
        self.counter = 0

    def uniq(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def present(self, f: FieldSpec) -> bool:
        return self.version in f.versions

    def is_tagged(self, f: FieldSpec) -> bool:
        return self.flexible and f.tag is not None and self.version in f.tagged

    def field_flexible(self, f: FieldSpec) -> bool:
        if f.flexible_override is not None:
            return self.version in f.flexible_override
        return self.flexible

    def nullable(self, f: FieldSpec) -> bool:
        return self.version in f.nullable

    # ---- decoding -------------------------------------------------------------------------

    def gen_struct(self, s: StructSpec) -> None:
        if not self.done:
            for name, cls in self.classes.items():
                self.ns[f"C_{name}"] = cls
        if s.name in self.done:
            return
        self.done.add(s.name)
        for f in s.fields:
            if f.struct is not None and self.present(f):
                self.gen_struct(f.struct)
        self.ns[f"C_{s.name}"] = self.classes[s.name]
        self.gen_decoder(s)
        self.gen_encoder(s)

    def gen_decoder(self, s: StructSpec) -> None:
        L = [f"def d_{s.name}(buf, pos):", f"    o = C_{s.name}.__new__(C_{s.name})"]
        absent = [f for f in s.fields if not self.present(f) or self.is_tagged(f)]
        for f in absent:
            L.append(f"    o.{f.attr} = {self.default_expr(f)}")
        regular = [f for f in s.fields if self.present(f) and not self.is_tagged(f)]
        i = 0
        while i < len(regular):
            f = regular[i]
            if not f.is_array and f.type in _FIXED:
                run = [f]
                while i + 1 < len(regular) and not regular[i + 1].is_array and regular[i + 1].type in _FIXED:
                    i += 1
                    run.append(regular[i])
                fmt = ">" + "".join(_FIXED[x.type][0] for x in run)
                size = sum(_FIXED[x.type][1] for x in run)
                sname = self.uniq("S")
                self.ns[sname] = struct.Struct(fmt)
                L.append(f"    _check(buf, pos + {size})")
                targets = ", ".join(f"o.{x.attr}" for x in run)
                L.append(f"    {targets}{',' if len(run) == 1 else ''} = {sname}.unpack_from(buf, pos)")
                L.append(f"    pos += {size}")
            else:
                self.decode_field(L, f, f"o.{f.attr}", "    ")
            i += 1
        if self.flexible:
            tagged = [f for f in s.fields if self.is_tagged(f)]
            L.append("    n, pos = _uv(buf, pos)")
            L.append("    for _ in range(n):")
            L.append("        tag, pos = _uv(buf, pos)")
            L.append("        size, pos = _uv(buf, pos)")
            L.append("        end = pos + size")
            L.append("        _check(buf, end)")
            first = True
            for f in tagged:
                kw = "if" if first else "elif"
                first = False
                L.append(f"        {kw} tag == {f.tag}:")
                self.decode_field(L, f, f"o.{f.attr}", "            ")
            L.append("        pos = end")
        L.append("    return o, pos")
        self.lines.extend(L)
        self.lines.append("")

    def default_expr(self, f: FieldSpec) -> str:
        if f.is_array:
            return "None" if f.default is None else "[]"
        if f.struct is not None:
            if f.nullable.low >= 0 and f.default is None:
                return "None"
            return f"C_{f.struct.name}()"
        return repr(f.default)

    def decode_field(self, L: list[str], f: FieldSpec, target: str, ind: str) -> None:
        flex = self.field_flexible(f)
        if f.is_array:
            n = self.uniq("n")
            if flex:
                L.append(f"{ind}{n}, pos = _uv(buf, pos)")
                L.append(f"{ind}{n} -= 1")
            else:
                L.append(f"{ind}_check(buf, pos + 4)")
                L.append(f"{ind}{n} = _I32.unpack_from(buf, pos)[0]")
                L.append(f"{ind}pos += 4")
            L.append(f"{ind}if {n} < 0:")
            if self.nullable(f):
                L.append(f"{ind}    {target} = None")
            else:
                L.append(f"{ind}    raise DecodeError('null array {f.name}')")
            L.append(f"{ind}else:")
            L.append(f"{ind}    if {n} > len(buf) - pos:")
            L.append(f"{ind}        raise DecodeError('array length {f.name} exceeds message')")
            lst = self.uniq("a")
            L.append(f"{ind}    {lst} = []")
            L.append(f"{ind}    for _ in range({n}):")
            item = self.uniq("x")
            self.decode_scalar(L, f, item, ind + "        ", flex)
            L.append(f"{ind}        {lst}.append({item})")
            L.append(f"{ind}    {target} = {lst}")
        else:
            self.decode_scalar(L, f, target, ind, flex)

    def decode_scalar(self, L: list[str], f: FieldSpec, target: str, ind: str, flex: bool) -> None:
        t = f.type
        if f.struct is not None:
            if not f.is_array and self.nullable(f):
                L.append(f"{ind}_check(buf, pos + 1)")
                L.append(f"{ind}if buf[pos] == 255:")
                L.append(f"{ind}    pos += 1")
                L.append(f"{ind}    {target} = None")
                L.append(f"{ind}else:")
                L.append(f"{ind}    {target}, pos = d_{f.struct.name}(buf, pos + 1)")
            else:
                L.append(f"{ind}{target}, pos = d_{f.struct.name}(buf, pos)")
        elif t in _FIXED:
            fmt, size = _FIXED[t]
            sname = self.uniq("S")
            self.ns[sname] = struct.Struct(">" + fmt)
            L.append(f"{ind}_check(buf, pos + {size})")
            L.append(f"{ind}{target} = {sname}.unpack_from(buf, pos)[0]")
            L.append(f"{ind}pos += {size}")
        elif t == "uuid":
            L.append(f"{ind}_check(buf, pos + 16)")
            L.append(f"{ind}{target} = bytes(buf[pos:pos + 16])")
            L.append(f"{ind}pos += 16")
        elif t in ("string", "bytes", "records"):
            n = self.uniq("n")
            if flex:
                L.append(f"{ind}{n}, pos = _uv(buf, pos)")
                L.append(f"{ind}{n} -= 1")
            elif t == "string":
                L.append(f"{ind}_check(buf, pos + 2)")
                L.append(f"{ind}{n} = _I16.unpack_from(buf, pos)[0]")
                L.append(f"{ind}pos += 2")
            else:
                L.append(f"{ind}_check(buf, pos + 4)")
                L.append(f"{ind}{n} = _I32.unpack_from(buf, pos)[0]")
                L.append(f"{ind}pos += 4")
            L.append(f"{ind}if {n} < 0:")
            if self.nullable(f) or t == "records":
                L.append(f"{ind}    {target} = None")
            else:
                L.append(f"{ind}    raise DecodeError('null {f.name}')")
            L.append(f"{ind}else:")
            L.append(f"{ind}    _check(buf, pos + {n})")
            if t == "string":
                L.append(f"{ind}    {target} = str(buf[pos:pos + {n}], 'utf-8')")
            elif t == "records" and self.view_records:
                L.append(f"{ind}    {target} = buf[pos:pos + {n}]")
            else:
                L.append(f"{ind}    {target} = bytes(buf[pos:pos + {n}])")
            L.append(f"{ind}    pos += {n}")
        else:
            raise ValueError(f"unknown type {t}")

    # ---- encoding -------------------------------------------------------------------------

    def gen_encoder(self, s: StructSpec) -> None:
        L = [f"def e_{s.name}(o, out):"]
        regular = [f for f in s.fields if self.present(f) and not self.is_tagged(f)]
        i = 0
        while i < len(regular):
            f = regular[i]
            if not f.is_array and f.type in _FIXED:
                run = [f]
                while i + 1 < len(regular) and not regular[i + 1].is_array and regular[i + 1].type in _FIXED:
                    i += 1
                    run.append(regular[i])
                fmt = ">" + "".join(_FIXED[x.type][0] for x in run)
                sname = self.uniq("S")
                self.ns[sname] = struct.Struct(fmt)
                args = ", ".join(f"o.{x.attr}" for x in run)
                L.append(f"    out += {sname}.pack({args})")
            else:
                self.encode_field(L, f, f"o.{f.attr}", "    ")
            i += 1
        if self.flexible:
            tagged = sorted((f for f in s.fields if self.is_tagged(f)), key=lambda f: f.tag or 0)
            if not tagged:
                L.append("    out.append(0)")
            else:
                L.append("    tags = []")
                for f in tagged:
                    dname = self.uniq("D")
                    if f.struct is not None and not f.is_array:
                        self.ns[dname] = self.classes[f.struct.name]()
                        cond = f"o.{f.attr} is not None and o.{f.attr} != {dname}"
                    elif f.is_array:
                        # As in Kafka: written unless it equals the default (None, or empty), so a null
                        # array whose default is empty is written, and so is an empty one whose default is null.
                        self.ns[dname] = f.default
                        cond = f"o.{f.attr} != {dname}"
                    else:
                        self.ns[dname] = f.default
                        cond = f"o.{f.attr} != {dname}"
                    L.append(f"    if {cond}:")
                    L.append("        t = bytearray()")
                    self.encode_field(L, f, f"o.{f.attr}", "        ", out="t")
                    L.append(f"        tags.append(({f.tag}, t))")
                L.append("    if not tags:")
                L.append("        out.append(0)")
                L.append("    else:")
                L.append("        _wuv(out, len(tags))")
                L.append("        for tag, t in tags:")
                L.append("            _wuv(out, tag)")
                L.append("            _wuv(out, len(t))")
                L.append("            out += t")
        if len(L) == 1:
            L.append("    pass")
        self.lines.extend(L)
        self.lines.append("")

    def encode_field(self, L: list[str], f: FieldSpec, value: str, ind: str, out: str = "out") -> None:
        flex = self.field_flexible(f)
        if f.is_array:
            v = self.uniq("v")
            L.append(f"{ind}{v} = {value}")
            L.append(f"{ind}if {v} is None:")
            if flex:
                L.append(f"{ind}    {out}.append(0)")
            else:
                L.append(f"{ind}    {out} += b'\\xff\\xff\\xff\\xff'")
            L.append(f"{ind}else:")
            if flex:
                self.write_length(L, f"len({v}) + 1", ind + "    ", out)
            else:
                L.append(f"{ind}    {out} += _I32.pack(len({v}))")
            item = self.uniq("x")
            L.append(f"{ind}    for {item} in {v}:")
            self.encode_scalar(L, f, item, ind + "        ", flex, out)
        else:
            self.encode_scalar(L, f, value, ind, flex, out)

    def write_length(self, L: list[str], length: str, ind: str, out: str) -> None:
        """A compact length (uvarint): one byte, appended in place, for the usual short string or array."""
        n = self.uniq("n")
        L.append(f"{ind}{n} = {length}")
        L.append(f"{ind}if {n} < 128:")
        L.append(f"{ind}    {out}.append({n})")
        L.append(f"{ind}else:")
        L.append(f"{ind}    _wuv({out}, {n})")

    def encode_scalar(self, L: list[str], f: FieldSpec, value: str, ind: str, flex: bool, out: str) -> None:
        t = f.type
        if f.struct is not None:
            if not f.is_array and self.nullable(f):
                L.append(f"{ind}if {value} is None:")
                L.append(f"{ind}    {out}.append(255)")
                L.append(f"{ind}else:")
                L.append(f"{ind}    {out}.append(1)")
                L.append(f"{ind}    e_{f.struct.name}({value}, {out})")
            else:
                L.append(f"{ind}e_{f.struct.name}({value}, {out})")
        elif t in _FIXED:
            sname = self.uniq("S")
            self.ns[sname] = struct.Struct(">" + _FIXED[t][0])
            L.append(f"{ind}{out} += {sname}.pack({value})")
        elif t == "uuid":
            L.append(f"{ind}{out} += {value}")
        elif t in ("string", "bytes", "records"):
            v = self.uniq("v")
            L.append(f"{ind}{v} = {value}")
            L.append(f"{ind}if {v} is None:")
            if flex:
                L.append(f"{ind}    {out}.append(0)")
            elif t == "string":
                L.append(f"{ind}    {out} += b'\\xff\\xff'")
            else:
                L.append(f"{ind}    {out} += b'\\xff\\xff\\xff\\xff'")
            L.append(f"{ind}else:")
            if t == "string":
                L.append(f"{ind}    {v} = {v}.encode('utf-8')")
            if flex:
                self.write_length(L, f"len({v}) + 1", ind + "    ", out)
            elif t == "string":
                L.append(f"{ind}    {out} += _I16.pack(len({v}))")
            else:
                L.append(f"{ind}    {out} += _I32.pack(len({v}))")
            if t == "records":
                L.append(f"{ind}    _wrec({out}, {v})")
            else:
                L.append(f"{ind}    {out} += {v}")
        else:
            raise ValueError(f"unknown type {t}")

    def compile(self) -> tuple[Callable[[Any, int], tuple[Any, int]], Callable[[Any, bytearray], None]]:
        self.gen_struct(self.spec.root)
        source = "\n".join(self.lines)
        code = compile(source, f"<shoal codec {self.spec.name} v{self.version}>", "exec")
        exec(code, self.ns)
        return self.ns[f"d_{self.spec.root.name}"], self.ns[f"e_{self.spec.root.name}"]


Decoder = Callable[[Any, int], tuple[Any, int]]
Encoder = Callable[[Any, bytearray], None]


class MessageCodec:
    """Encoder/decoder pairs for every version of one message, compiled lazily and cached."""

    def __init__(self, spec: MessageSpec, cls: type[MessageBase]):
        self.spec = spec
        self.cls = bind_classes(spec, cls)
        self._classes: dict[str, type[MessageBase]] = {spec.root.name: self.cls}
        for name in spec.structs:
            self._classes[name] = getattr(self.cls, name)
        self._compiled: dict[int, tuple[Decoder, Encoder]] = {}
        self._view_decoders: dict[int, Decoder] = {}

    def _get(self, version: int) -> tuple[Decoder, Encoder]:
        pair = self._compiled.get(version)
        if pair is None:
            if version not in self.spec.valid:
                raise ValueError(f"{self.spec.name} has no version {version}")
            pair = _Gen(self.spec, version, self._classes).compile()
            self._compiled[version] = pair
        return pair

    def _view_decoder(self, version: int) -> Decoder:
        decoder = self._view_decoders.get(version)
        if decoder is None:
            if version not in self.spec.valid:
                raise ValueError(f"{self.spec.name} has no version {version}")
            decoder = _Gen(self.spec, version, self._classes, view_records=True).compile()[0]
            self._view_decoders[version] = decoder
        return decoder

    def decode(self, buf: Buffer, version: int, pos: int = 0, *, view_records: bool = False) -> tuple[Any, int]:
        """The message (an instance of `cls`, Any so callers can name its class) and the end position.

        With `view_records` its record sets are memoryviews into `buf`, not copies (writable when `buf`
        is): for a receiver that owns `buf` and hands the records on without keeping `buf` for more."""
        try:
            if view_records:
                return self._view_decoder(version)(buf if isinstance(buf, memoryview) else memoryview(buf), pos)
            return self._get(version)[0](buf, pos)
        except (IndexError, struct.error, UnicodeDecodeError, InvalidRecordBatch) as exc:
            raise DecodeError(f"cannot decode {self.spec.name} v{version}: {exc}") from exc

    def encode(self, obj: MessageBase, version: int, out: bytearray | None = None) -> bytearray:
        if out is None:
            out = bytearray()
        self._get(version)[1](obj, out)
        return out

    def is_flexible(self, version: int) -> bool:
        return version in self.spec.flexible
