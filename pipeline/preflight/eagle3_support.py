"""Whether the installed vLLM can capture EAGLE-3 hidden states for an architecture, read from its source text.

vLLM captures aux hidden states only from model classes for which ``supports_eagle3(cls)`` holds, that is
``isinstance(cls, SupportsEagle3)``. ``SupportsEagle3`` is a ``runtime_checkable`` Protocol, so the check is
"does the class have every member the protocol declares" (``hasattr`` on each), which in practice means "has
``SupportsEagle3`` somewhere in its MRO". Importing vLLM to ask costs 5-15 s and a GPU-host's CUDA stack; this
module answers the same question in milliseconds by parsing the registry and the model files with ``ast``:

* the architecture name maps to ``(module, class)`` through the registry's dict literals;
* the class's members are collected over its bases, followed through same-file definitions, aliases
  (``A = B``) and imports from anywhere inside the vllm package, with a depth limit and a cycle guard;
* the protocol's own member names are read from ``interfaces.py``, so the check mirrors the runtime one.

Bases outside the vllm package (``nn.Module``, ``typing.Protocol``) cannot carry vLLM's protocol members and count
as contributing nothing. Anything that cannot be followed (a base computed by a call, a missing file, modules that
pick a class per platform and disagree) makes the answer "unknown": a warning for preflight, never a failure.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field
from pathlib import Path

from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"
UNKNOWN = "unknown"
UNREGISTERED = "unregistered"

_REGISTRY = "model_executor/models/registry.py"
_INTERFACES = "vllm.model_executor.models.interfaces"
_PROTOCOL = "SupportsEagle3"
# The registry's union of every architecture dict; when a future vLLM renames it we fall back to all dicts.
_ALL_MODELS_DICT = "_VLLM_MODELS"
_REMOVED_DICT = "_PREVIOUSLY_SUPPORTED_MODELS"
# Base-class and import chains in vLLM are a handful deep; anything past this is a loop the cycle guard missed.
_MAX_DEPTH = 24
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Eagle3Support:
    architecture: str
    status: str  # "supported" | "unsupported" | "unknown" | "unregistered"
    model_class: str | None  # e.g. "LlamaForCausalLM"
    module: str | None  # e.g. "llama" (file under vllm/model_executor/models/), or the registry's dotted path
    reason: str  # one line, for a preflight row


# ---------------------------------------------------------------------------------------------------------------
# What a module-level name can be bound to, and what resolving a reference yields.


@dataclass(frozen=True)
class _ClassDef:
    module: str
    node: ast.ClassDef


@dataclass(frozen=True)
class _FromImport:
    module: str  # absolute dotted name
    name: str


@dataclass(frozen=True)
class _ModuleRef:
    module: str


@dataclass(frozen=True)
class _Expr:
    module: str
    node: ast.expr | None  # None: bound by something that is no class (a def, a tuple unpacking)
    what: str


_Binding = _ClassDef | _FromImport | _ModuleRef | _Expr


@dataclass(frozen=True)
class _External:
    """Something outside the vllm package (torch, typing, builtins): it cannot carry vLLM's protocol members."""


@dataclass(frozen=True)
class _Gap:
    note: str


_Target = _ClassDef | _ModuleRef | _External | _Gap


@dataclass(frozen=True)
class _Members:
    """Class-level names a class has. ``sure``: on every path; ``maybe``: on some platform branch. ``gaps``: why
    some base could not be followed (then more names may exist); ``branches``: where candidates differed."""

    sure: frozenset[str] = frozenset()
    maybe: frozenset[str] = frozenset()
    gaps: tuple[str, ...] = ()
    branches: tuple[str, ...] = ()


@dataclass
class _Module:
    name: str
    path: str  # "vllm/model_executor/models/llama.py", for messages
    is_package: bool
    runtime: dict[str, tuple[_Binding, ...]]
    # Names only bound under ``if TYPE_CHECKING:`` (lazy ``__getattr__`` packages): the best static hint there is.
    typing_only: dict[str, tuple[_Binding, ...]]
    star_imports: tuple[str, ...]


_Env = dict[str, tuple[_Binding, ...]]


# ---------------------------------------------------------------------------------------------------------------
# Module-level bindings, with if/else and try/except branches kept as alternatives.


def _is_type_checking(test: ast.expr) -> bool | None:
    """True for ``if TYPE_CHECKING``, False for ``if not TYPE_CHECKING``, None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _is_type_checking(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return True
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return True
    return None


def _merge(*envs: _Env) -> _Env:
    # A name bound differently on two branches keeps both bindings; the class check then demands they agree.
    merged: _Env = {}
    for env in envs:
        for name, binds in env.items():
            merged[name] = tuple(dict.fromkeys((*merged.get(name, ()), *binds)))
    return merged


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


@dataclass
class _Walker:
    module: str
    is_package: bool
    type_checking: bool  # which side of ``if TYPE_CHECKING`` to take
    stars: list[str] = field(default_factory=list)

    def walk(self, stmts: list[ast.stmt], env: _Env) -> _Env:
        for stmt in stmts:
            env = self.step(stmt, env)
        return env

    def step(self, stmt: ast.stmt, env: _Env) -> _Env:
        if isinstance(stmt, ast.If):
            side = _is_type_checking(stmt.test)
            if side is not None:
                return self.walk(stmt.body if side == self.type_checking else stmt.orelse, env)
            return _merge(self.walk(stmt.body, dict(env)), self.walk(stmt.orelse, dict(env)))
        if isinstance(stmt, ast.Try):
            tried = self.walk(stmt.body + stmt.orelse, dict(env))
            handled = [self.walk(h.body, dict(env)) for h in stmt.handlers]
            return self.walk(stmt.finalbody, _merge(tried, *handled))
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            return self.walk(stmt.body, env)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            return _merge(env, self.walk(stmt.body + stmt.orelse, dict(env)))
        env = dict(env)
        for name, binding in self.bindings(stmt):
            env[name] = (binding,)
        return env

    def bindings(self, stmt: ast.stmt) -> list[tuple[str, _Binding]]:
        if isinstance(stmt, ast.ClassDef):
            return [(stmt.name, _ClassDef(self.module, stmt))]
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return [(stmt.name, _Expr(self.module, None, f"`{stmt.name}` is a function"))]
        if isinstance(stmt, ast.Import):
            # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``.
            out: list[tuple[str, _Binding]] = []
            for a in stmt.names:
                top = a.name.split(".")[0]
                out.append((a.asname, _ModuleRef(a.name)) if a.asname else (top, _ModuleRef(top)))
            return out
        if isinstance(stmt, ast.ImportFrom):
            source = _absolute(self.module, self.is_package, stmt)
            if any(a.name == "*" for a in stmt.names):
                self.stars.append(source)
            return [(a.asname or a.name, _FromImport(source, a.name)) for a in stmt.names if a.name != "*"]
        if isinstance(stmt, ast.Assign):
            return [pair for target in stmt.targets for pair in self.assigned(target, stmt.value)]
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            return self.assigned(stmt.target, stmt.value)
        return []

    def assigned(self, target: ast.expr, value: ast.expr) -> list[tuple[str, _Binding]]:
        if isinstance(target, ast.Name):
            return [(target.id, _Expr(self.module, value, ast.unparse(value)[:60]))]
        if isinstance(target, (ast.Tuple, ast.List)):
            return [(n.id, _Expr(self.module, None, f"`{n.id}` is unpacked from a tuple"))
                    for n in target.elts if isinstance(n, ast.Name)]
        return []


# ---------------------------------------------------------------------------------------------------------------
# Resolution over the vllm package's files.


def _class_names(node: ast.ClassDef, *, annotations: bool) -> frozenset[str]:
    """Names the class body binds at class level. Annotation-only names count for a protocol (they are members
    of it) but not for a model class (``hasattr`` is false without a value)."""
    names: set[str] = set()
    pending = list(node.body)
    while pending:
        stmt = pending.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if annotations or stmt.value is not None:
                names.add(stmt.target.id)
        elif isinstance(stmt, ast.If):  # a class body's branches are rare; either side may define the name
            pending.extend(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            pending.extend(stmt.body + stmt.orelse + stmt.finalbody + [s for h in stmt.handlers for s in h.body])
    return frozenset(names)


class Eagle3Checker:
    """One check's state: parsed modules and resolved classes are cached here, so checking many architectures
    with one checker parses each vLLM file once."""

    def __init__(self, vllm: InstalledVLLM) -> None:
        self.vllm = vllm
        self._modules: dict[str, _Module | None] = {}
        self._members: dict[tuple[str, int, bool], _Members] = {}
        self._active: set[tuple[str, int, bool]] = set()
        self._registry: tuple[dict[str, tuple[str, str]], dict[str, str]] | None = None
        self._required: frozenset[str] | None = None

    # -- registry --------------------------------------------------------------------------------------------

    def registry(self) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
        """(architecture -> (module, class), removed architecture -> last vLLM version that had it)."""
        if self._registry is None:
            self._registry = _parse_registry(self.vllm.read(_REGISTRY))
        return self._registry

    # -- modules ---------------------------------------------------------------------------------------------

    def _locate(self, module: str) -> tuple[str, bool] | None:
        """Relative path of a vllm module's file under the package root, and whether it is a package."""
        parts = module.split(".")
        if parts[0] != "vllm":
            return None
        base = Path(*parts[1:]) if len(parts) > 1 else Path()
        if len(parts) > 1 and (self.vllm.root / base.with_suffix(".py")).is_file():
            return str(base.with_suffix(".py")), False
        if (self.vllm.root / base / "__init__.py").is_file():
            return str(base / "__init__.py"), True
        return None

    def module(self, name: str) -> _Module | None:
        if name not in self._modules:
            self._modules[name] = self._parse_module(name)
        return self._modules[name]

    def _parse_module(self, name: str) -> _Module | None:
        located = self._locate(name)
        if located is None:
            return None
        relative, is_package = located
        try:
            tree = ast.parse(self.vllm.read(relative))
        except (SyntaxError, ValueError):
            return None
        runtime_walker = _Walker(name, is_package, type_checking=False)
        runtime = runtime_walker.walk(tree.body, {})
        typing_env = _Walker(name, is_package, type_checking=True).walk(tree.body, {})
        typing_only = {k: v for k, v in typing_env.items() if k not in runtime}
        return _Module(name, f"vllm/{relative}", is_package, runtime, typing_only, tuple(runtime_walker.stars))

    # -- names -----------------------------------------------------------------------------------------------

    def lookup(self, module: str, name: str, depth: int) -> list[_Target]:
        """What ``module.name`` is at run time; several targets when platform branches bind it differently."""
        if not module.startswith("vllm.") and module != "vllm":
            return [_External()]
        if depth > _MAX_DEPTH:
            return [_Gap(f"gave up following `{name}` past {_MAX_DEPTH} imports")]
        mod = self.module(module)
        if mod is None:
            return [_Gap(f"no file for vllm module `{module}`")]
        binds = mod.runtime.get(name) or mod.typing_only.get(name)
        if binds:
            return [t for b in binds for t in self.resolve(b, depth + 1)]
        if mod.is_package and self._locate(f"{module}.{name}") is not None:
            return [_ModuleRef(f"{module}.{name}")]  # ``from pkg import submodule``
        for star in mod.star_imports:
            found = self.lookup(star, name, depth + 1)
            if not any(isinstance(t, _Gap) for t in found):
                return found
        if name in _BUILTINS:
            return [_External()]
        return [_Gap(f"`{name}` is not defined in {mod.path}")]

    def resolve(self, binding: _Binding, depth: int) -> list[_Target]:
        if isinstance(binding, (_ClassDef, _ModuleRef)):
            return [binding]
        if isinstance(binding, _FromImport):
            return self.lookup(binding.module, binding.name, depth)
        if binding.node is None:
            return [_Gap(binding.what)]
        return self.expr(binding.module, binding.node, depth)

    def expr(self, module: str, node: ast.expr, depth: int) -> list[_Target]:
        """Targets of a reference written in ``module``: ``Name``, ``pkg.Name``, ``Generic[T]``."""
        if isinstance(node, ast.Name):
            return self.lookup(module, node.id, depth)
        if isinstance(node, ast.Subscript):
            return self.expr(module, node.value, depth)
        if isinstance(node, ast.Attribute):
            out: list[_Target] = []
            for target in self.expr(module, node.value, depth):
                if isinstance(target, _ModuleRef):
                    out.extend(self.lookup(target.module, node.attr, depth + 1))
                elif isinstance(target, (_External, _Gap)):
                    out.append(target)
                else:
                    out.append(_Gap(f"`{ast.unparse(node)}` is an attribute of a class"))
            return out
        where = self.module(module)
        return [_Gap(f"`{ast.unparse(node)[:60]}` in {where.path if where else module} is computed at import time")]

    # -- classes ---------------------------------------------------------------------------------------------

    def members(self, cls: _ClassDef, *, annotations: bool = False, depth: int = 0) -> _Members:
        key = (cls.module, cls.node.lineno, annotations)
        if key in self._members:
            return self._members[key]
        if key in self._active or depth > _MAX_DEPTH:
            return _Members(gaps=(f"`{cls.node.name}` inherits from itself or too deeply",))
        self._active.add(key)
        try:
            result = self._class_members(cls, annotations, depth)
        finally:
            self._active.discard(key)
        self._members[key] = result
        return result

    def _class_members(self, cls: _ClassDef, annotations: bool, depth: int) -> _Members:
        own = _class_names(cls.node, annotations=annotations)
        sure, maybe = set(own), set(own)
        gaps: list[str] = []
        branches: list[str] = []
        for base in cls.node.bases:
            got = self.combine(self.expr(cls.module, base, depth + 1), annotations, depth + 1, where=base)
            sure |= got.sure
            maybe |= got.maybe
            gaps.extend(got.gaps)
            branches.extend(got.branches)
        return _Members(frozenset(sure), frozenset(maybe), tuple(gaps), tuple(branches))

    def combine(self, targets: list[_Target], annotations: bool, depth: int, where: ast.expr) -> _Members:
        """Members of a reference that may resolve to several classes (one per platform branch)."""
        parts: list[_Members] = []
        for target in targets:
            if isinstance(target, _ClassDef):
                parts.append(self.members(target, annotations=annotations, depth=depth))
            elif isinstance(target, _External):
                parts.append(_Members())
            elif isinstance(target, _Gap):
                parts.append(_Members(gaps=(target.note,)))
            else:
                parts.append(_Members(gaps=(f"`{ast.unparse(where)}` is a module, not a class",)))
        if not parts:
            return _Members(gaps=(f"`{ast.unparse(where)}` resolves to nothing",))
        sure = frozenset.intersection(*(p.sure for p in parts))
        maybe = frozenset.union(*(p.maybe for p in parts))
        branches = [b for p in parts for b in p.branches]
        if len({p.sure for p in parts}) > 1:
            branches.append(f"`{ast.unparse(where)}` is a different class on different platform branches")
        return _Members(sure, maybe, tuple(g for p in parts for g in p.gaps), tuple(branches))

    def required(self) -> frozenset[str]:
        """The protocol's members as ``typing`` checks them: every public name over its protocol bases."""
        if self._required is None:
            found = [t for t in self.lookup(_INTERFACES, _PROTOCOL, 0) if isinstance(t, _ClassDef)]
            names = self.members(found[0], annotations=True).sure if len(found) == 1 else frozenset()
            self._required = frozenset(n for n in names if not n.startswith("_"))
        return self._required

    # -- the answer ------------------------------------------------------------------------------------------

    def check(self, architecture: str) -> Eagle3Support:
        models, removed = self.registry()
        version = self.vllm.version
        if not models:
            return Eagle3Support(architecture, UNKNOWN, None, None,
                                 f"could not read the model registry of vLLM {version} ({_REGISTRY})")
        if architecture not in models:
            was = f" (last supported in vLLM {removed[architecture]})" if architecture in removed else ""
            return Eagle3Support(architecture, UNREGISTERED, None, None,
                                 f"{architecture} is not in vLLM {version}'s model registry{was}")
        module, cls = models[architecture]
        dotted = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        where = self.module(dotted)
        path = where.path if where else f"vllm/model_executor/models/{module}.py"

        def answer(status: str, reason: str) -> Eagle3Support:
            return Eagle3Support(architecture, status, cls, module, reason)

        required = self.required()
        if not required:
            return answer(UNKNOWN, f"could not find {_PROTOCOL} in vLLM {version}'s {_INTERFACES}")
        got = self.combine(self.lookup(dotted, cls, 0), annotations=False, depth=0, where=ast.Name(cls))
        if required <= got.sure:
            return answer(SUPPORTED, f"{cls} implements {_PROTOCOL} in vLLM {version}")
        if not got.gaps and not required <= got.maybe:
            return answer(UNSUPPORTED, f"{cls} ({path}) does not implement {_PROTOCOL} in vLLM {version}: "
                                       "this vLLM cannot capture its hidden states")
        why = (got.gaps or got.branches or ("the class could not be followed",))[0]
        return answer(UNKNOWN, f"could not tell whether {cls} ({path}) implements {_PROTOCOL} in vLLM {version}: {why}")


def _parse_registry(text: str) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}, {}
    dicts: dict[str, ast.Dict] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            dicts[target.id] = value
    if _ALL_MODELS_DICT in dicts:
        models = _registry_entries(dicts[_ALL_MODELS_DICT], dicts, depth=0)
    else:  # a renamed union: every dict of (module, class) pairs, in file order as dict unpacking would apply them
        models = {k: v for d in dicts.values() for k, v in _registry_entries(d, dicts, depth=0).items()}
    removed = {}
    if _REMOVED_DICT in dicts:
        for key, value in zip(dicts[_REMOVED_DICT].keys, dicts[_REMOVED_DICT].values):
            if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                removed[str(key.value)] = str(value.value)
    return models, removed


def _registry_entries(node: ast.Dict, dicts: dict[str, ast.Dict], depth: int) -> dict[str, tuple[str, str]]:
    """``"Arch": ("module", "Class")`` entries of one dict literal, ``**OTHER`` spreads expanded in place (later
    entries win, as in Python)."""
    out: dict[str, tuple[str, str]] = {}
    for key, value in zip(node.keys, node.values):
        if key is None:  # ``**NAME``
            if isinstance(value, ast.Name) and value.id in dicts and depth < _MAX_DEPTH:
                out.update(_registry_entries(dicts[value.id], dicts, depth + 1))
            continue
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:
            pair = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(pair) == 2:
                out[key.value] = (pair[0], pair[1])
    return out


def eagle3_support(vllm: InstalledVLLM, architecture: str) -> Eagle3Support:
    """Whether ``vllm`` can capture EAGLE-3 hidden states for ``architecture`` (a config's ``architectures[0]``)."""
    return Eagle3Checker(vllm).check(architecture)


def registered_architectures(vllm: InstalledVLLM) -> list[str]:
    """Every architecture name the installed vLLM's registry lists, sorted."""
    return sorted(Eagle3Checker(vllm).registry()[0])
