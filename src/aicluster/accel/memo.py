"""Fewer round trips: each fact read once per host until something on a host changes,
and the reads of the previous run fetched in one command at the start.

pyinfra 3 runs a fact's command every time an operation asks for it, and asks twice
per operation: once while preparing (to say whether it will change) and once more
while executing. Every ``files.put`` asks for its file, its checksum and its
directory, every user and group operation for the OS. A no-op re-run of the whole
stack asked each node several hundred times, one SSH command each, one operation at
a time across all nodes, so each read waited for the slowest node. Yet a host only
changes when a command runs on it, so

* a repeated read is answered from memory (a copy, so no operation can alter
  another's view) while operations are prepared (nothing runs then) and, while they
  execute, until any operation on any host runs a command, uploads a file or calls a
  Python function. Then every host's memory is forgotten and facts are read afresh
  (and remembered again until the next change). Facts read inside a Python callback
  (``python.call``: drains, waits, polls) are never answered from memory;
* which facts a host was asked for is remembered on the deploying machine (the fact
  names and their arguments, never their values), and the next run reads all of them
  in ONE command before preparing, with pyinfra's own fact classes parsing each part.
  Files' stat and checksums and units' states are read a kind at a time (one ``stat``,
  one ``sha1sum``, one ``systemctl show``), and the whole answer comes back gzipped
  as one line. A part that fails or is missing is simply read again the normal way.
  A few of pyinfra's own commands are swapped there for shell builtins printing the
  same (:data:`CHEAPER_COMMANDS`) or for cheaper reads the fact parses to the same
  answer (:data:`CHEAPER_PARSED`: dpkg's package list), and answers that depend on
  their output alone are parsed once for all hosts that print the same
  (:data:`SHARED_PROCESS`).

In a re-run that changes nothing, each host is asked once.
"""


from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import importlib
import inspect
import json
import os
import re
import shlex
import sys
import zlib
from pathlib import Path
from typing import Any

from aicluster.accel.guard import PATCHES
from aicluster.render import plain_copy

#: Where the fact names a host was asked for are kept between runs.
READS_DIR = Path(os.environ.get("AICLUSTER_FACT_READS_DIR", "~/.cache/aicluster/fact-reads"))
#: Facts never remembered: arbitrary commands (their text may be anything).
NOT_REMEMBERED = frozenset({"pyinfra.facts.server:Command"})
#: pyinfra fact commands (their exact text) and what the one-command read runs
#: instead: the same output from the shell itself, not a process each (uname) or three
#: (``ls | grep`` for the release files). A pyinfra that changes its command text gets
#: its own run. tests/unit/test_accel_memo.py compares the outputs.
CHEAPER_COMMANDS = {
    "uname -n": ('{ read -r v < /proc/sys/kernel/hostname && printf "%s\\n" "$v"; } '
                 '2>/dev/null || uname -n'),
    "uname -s": ('{ read -r v < /proc/sys/kernel/ostype && printf "%s\\n" "$v"; } '
                 '2>/dev/null || uname -s'),
    # LinuxDistribution: each regular file /etc/*-release (links followed), named,
    # then its text, then ---.
    ("cd /etc/ && for file in $(ls -pdL *-release | grep -v /); "
     'do echo "/etc/${file}"; cat "/etc/${file}"; echo ---; done'): (
        'for file in /etc/*-release; do [ -f "$file" ] || continue; '
        'echo "$file"; cat "$file"; echo ---; done'),
}
#: dpkg's installed packages, as ``dpkg -l`` lists them for pyinfra's ``DebPackages``
#: (desired install or hold, installed, no error flag: ``ii``/``hi``), read from dpkg's
#: status file by awk instead of dpkg loading its whole database (about 5 ms of a
#: node's CPU). Name, version and architecture only: the fact reads no more. dpkg
#: itself runs where the status file is unreadable, awk is missing, or a dpkg run left
#: updates not yet merged into the status file.
DPKG_STATUS_LIST = (
    "_u=; for _f in /var/lib/dpkg/updates/[0-9]*; do [ -e \"$_f\" ] && _u=1; done; "
    "if [ -z \"$_u\" ] && [ -r /var/lib/dpkg/status ] && command -v awk >/dev/null 2>&1; "
    "then awk 'function out() { if (p != \"\" && f == \"ok\" && s == \"installed\" "
    "&& (w == \"install\" || w == \"hold\")) print substr(w, 1, 1) \"i  \" p \" \" v "
    "\" \" (a == \"\" ? \"-\" : a); p = v = a = w = f = s = \"\" } "
    "/^Package: / { p = $2 } /^Version: / { v = $2 } /^Architecture: / { a = $2 } "
    "/^Status: / { w = $2; f = $3; s = $4 } /^$/ { out() } END { out() }' "
    "/var/lib/dpkg/status; else dpkg -l; fi"
)
#: pyinfra fact commands (the fact's name and the exact text) the one-command read
#: swaps for one printing other text that the fact parses to the same answer.
#: tests/unit/test_accel_memo.py compares the answers.
CHEAPER_PARSED = {
    ("pyinfra.facts.deb:DebPackages", "dpkg -l"): DPKG_STATUS_LIST,
}
#: Facts whose answer depends on their output alone: hosts that print the same are
#: parsed once per run (the distribution's files go through a temporary directory,
#: the package list is hundreds of lines). Answers are handed out as copies.
SHARED_PROCESS = frozenset({
    "pyinfra.facts.server:LinuxDistribution", "pyinfra.facts.deb:DebPackages",
})
#: Connector arguments that change what a fact command prints (who runs it, where,
#: with which shell and environment). Timeouts, retries, passwords and exit-code
#: lists change how it runs, not what it reads.
FACT_AFFECTING = frozenset({
    "_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user",
    "_use_su_login", "_preserve_su_env", "_su_shell", "_doas", "_doas_user", "_dzdo",
    "_dzdo_user", "_shell_executable", "_chdir", "_env",
})
_MARK = "@@aicluster-fact@@"
_MARK_RE = re.compile(rf"^{re.escape(_MARK)} (\d+) (begin|rc (\d+))$")


def _baseline(host) -> dict[str, Any]:
    """The connector arguments (sudo, su, shell, env ...) every operation on *host* has
    unless it says otherwise: pyinfra's defaults under the host's data."""
    from pyinfra.api.arguments import all_argument_meta, default_sentinel

    state = getattr(host, "state", None)
    if state is None:
        return {}
    cache = state.__dict__.setdefault("aicluster_connector_baseline", {})
    if host.name not in cache:
        out = {}
        for key in FACT_AFFECTING & set(all_argument_meta):
            meta = all_argument_meta[key]
            value = getattr(host.data, key, default_sentinel)
            if value is default_sentinel:
                value = meta.default(state.config)
            if meta.handler:
                value = meta.handler(state.config, value)
            out[key] = value
        cache[host.name] = out
    return cache[host.name]


def _connector_args(host) -> dict[str, Any]:
    """The connector arguments of the operation asking that change what a fact reads,
    where they differ from the host's baseline (a fact read with sudo is another read)."""
    current = getattr(host, "current_op_global_arguments", None) or {}
    if not current:
        return {}
    baseline = _baseline(host)
    return {
        k: v for k, v in current.items()
        if k in FACT_AFFECTING and (k not in baseline or v != baseline[k])
    }


def fact_key(host, cls, args, kwargs, connector: dict | None = None) -> str | None:
    """What makes one fact read the same as another on *host*: the fact, its arguments
    and the connector arguments (sudo, su, shell) of the operation asking for it."""
    try:
        return repr((cls.__module__, cls.__qualname__, tuple(args or ()),
                     sorted((kwargs or {}).items()),
                     sorted((_connector_args(host) if connector is None else connector).items())))
    except TypeError:  # unsortable arguments: not memoised
        return None


def _memo(state, host_name: str) -> dict[str, Any]:
    return state.__dict__.setdefault("aicluster_fact_memo", {}).setdefault(host_name, {})


def _reads(state, host_name: str) -> dict[str, list[Any]]:
    """The reads noted for the host, in the order first asked, by their JSON text (a
    host is asked a hundred-odd times per run, mostly for reads noted already)."""
    return state.__dict__.setdefault("aicluster_fact_reads", {}).setdefault(host_name, {})


def _remember(state, host, cls, args, kwargs, connector: dict | None = None,
              key: str | None = None) -> None:
    """Note a plain read (no sudo/su, JSON-able arguments) to prefetch next time. *key*
    (its :func:`fact_key`) spares working out again a read noted already."""
    noted = state.__dict__.setdefault("aicluster_fact_noted", {}).setdefault(host.name, set())
    if key is not None:
        if key in noted:
            return
        noted.add(key)  # the same key, the same outcome below
    name = f"{cls.__module__}:{cls.__qualname__}"
    if name in NOT_REMEMBERED or (_connector_args(host) if connector is None else connector):
        return
    entry = [name, list(args or ()), dict(kwargs or {})]
    try:
        text = json.dumps(entry, sort_keys=True)
    except TypeError:
        return
    _reads(state, host.name).setdefault(text, entry)


def _put_code():
    from pyinfra.operations import files

    return files.put._inner.__code__


def _note_put_checksum(state, host, cls, args, kwargs) -> None:
    """``files.put`` of a file that is not there yet reads only its ``File`` fact; the
    next run, the file there, it reads the file's ``Sha1File`` too. Note that read now
    (when ``File`` found nothing and ``files.put`` asked), so the first re-run after a
    deploy reads those checksums with everything else in its one command instead of one
    operation after another."""
    if (cls.__module__ != "pyinfra.facts.files" or cls.__qualname__ != "File" or args
            or set(kwargs or {}) != {"path"}):
        return
    put, frame = _put_code(), sys._getframe(2)
    for _ in range(6):  # files.put -> host.get_fact -> this memo (a wrapper or two)
        if frame is None:
            return
        if frame.f_code is put:
            break
        frame = frame.f_back
    else:
        return
    from pyinfra.facts.files import Sha1File

    _remember(state, host, Sha1File, (), {"path": kwargs["path"]})


def _stage(state):
    from pyinfra.api.state import StateStage

    stage = getattr(state, "current_stage", None)
    if stage == StateStage.Prepare:
        return "prepare"
    if stage == StateStage.Execute:
        return "execute"
    return None


def _current() -> Any:
    import gevent

    return gevent.getcurrent()


def _forget(state) -> None:
    """Something may have changed on a host: forget every host's answers (a command
    on one host can change what another reports, e.g. a Slurm node's state)."""
    if state is None or _stage(state) != "execute":
        return
    if STATS_DIR:
        import traceback

        where = traceback.extract_stack(limit=6)[0]
        _count(state, "*", f"forgotten at {Path(where.filename).name}:{where.lineno}")
    state.__dict__["aicluster_fact_memo"] = {}
    state.__dict__["aicluster_fact_epoch"] = state.__dict__.get("aicluster_fact_epoch", 0) + 1


#: Set AICLUSTER_FACT_STATS to a directory to get, per host, how each read was answered
#: (from memory, read and remembered, read without memory) and what made the memory
#: be forgotten, written when pyinfra disconnects (bench/noop_rerun.py --stats).
STATS_DIR = os.environ.get("AICLUSTER_FACT_STATS", "")


def _count(state, host_name: str, what: str) -> None:
    stats = state.__dict__.setdefault("aicluster_fact_stats", {}).setdefault(host_name, {})
    stats[what] = stats.get(what, 0) + 1


def save_stats(state, host_name: str) -> None:
    if not STATS_DIR:
        return
    stats = state.__dict__.get("aicluster_fact_stats", {})
    out = Path(STATS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', host_name)}.json").write_text(json.dumps(
        {"host": stats.get(host_name, {}), "all hosts": stats.get("*", {})},
        indent=1, sort_keys=True))


#: How many facts have been asked for in this process (a read plan made while none was
#: asked depends on no host's facts: :func:`_read_plan`).
_ASKED = [0]
_READING: set[Any] = set()  # greenlets reading a fact (their commands change nothing)
# Python callbacks running now (pyinfra runs each in a greenlet of its own, and one
# may read or change any host): while any runs, nothing is answered from memory.
_FUNCTIONS = [0]


def memoize_facts() -> None:
    """Install the memo in front of pyinfra's ``get_fact``, and make every command,
    upload and Python callback an operation runs forget it (once per process)."""
    from pyinfra.api import host as api_host
    from pyinfra.api.command import FunctionCommand

    real = api_host.get_fact
    if getattr(real, "aicluster_memo", False):
        return

    def get_fact(state, host, cls, args=None, kwargs=None, **rest):
        _ASKED[0] += 1
        me = _current()
        key = None
        connector = None
        if state is not None and _stage(state) and not rest and not _FUNCTIONS[0]:
            connector = _connector_args(host)
            key = fact_key(host, cls, args, kwargs, connector)
        if key is not None and key not in _memo(state, host.name):
            _await_prefetch(state, host)
        if STATS_DIR and state is not None:
            why = ("memory" if key is not None and key in _memo(state, host.name)
                   else "read" if key is not None else "read, not memoised")
            _count(state, host.name, f"{_stage(state)}: {why}: {cls.__name__}")
        if key is None:
            _READING.add(me)
            try:
                return real(state, host, cls, args=args, kwargs=kwargs, **rest)
            finally:
                _READING.discard(me)
        memo = _memo(state, host.name)
        if key not in memo:
            epoch = state.__dict__.get("aicluster_fact_epoch", 0)
            _READING.add(me)
            try:
                value = real(state, host, cls, args=args, kwargs=kwargs)
            finally:
                _READING.discard(me)
            if state.__dict__.get("aicluster_fact_epoch", 0) != epoch:
                _remember(state, host, cls, args, kwargs, connector, key)
                return value  # a change ran meanwhile: this answer may be stale already
            memo = _memo(state, host.name)
            memo[key] = value
        _remember(state, host, cls, args, kwargs, connector, key)
        if not memo[key]:
            _note_put_checksum(state, host, cls, args, kwargs)
        return plain_copy(memo[key])

    get_fact.aicluster_memo = True  # type: ignore[attr-defined]
    PATCHES.replace(api_host, "get_fact", get_fact)
    if getattr(FunctionCommand.execute, "aicluster_memo", False):
        return

    def changing(method):
        def wrapper(self, *args, **kwargs):
            if _current() not in _READING:
                _forget(getattr(self, "state", None))
            try:
                return method(self, *args, **kwargs)
            finally:
                if _current() not in _READING:
                    _forget(getattr(self, "state", None))
        wrapper.__name__ = method.__name__
        wrapper.__doc__ = method.__doc__
        wrapper.aicluster_memo = True  # type: ignore[attr-defined]
        return wrapper

    for name in ("run_shell_command", "put_file", "rsync"):
        PATCHES.replace(api_host.Host, name, changing(getattr(api_host.Host, name)))

    function_execute = FunctionCommand.execute

    def execute(self, state, host, connector_arguments):
        _forget(state)
        _FUNCTIONS[0] += 1
        try:
            return function_execute(self, state, host, connector_arguments)
        finally:
            _FUNCTIONS[0] -= 1
            _forget(state)

    execute.aicluster_memo = True  # type: ignore[attr-defined]
    PATCHES.replace(FunctionCommand, "execute", execute)


# --- remembering reads between runs -------------------------------------------------


def reads_file(host) -> Path:
    """One file per host and address, under READS_DIR."""
    ident = hashlib.sha256(f"{host.name}\0{host.data.get('ssh_hostname')}".encode())
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host.name)
    return READS_DIR.expanduser() / f"{safe}-{ident.hexdigest()[:12]}.json"


def save_reads(host) -> None:
    """Keep the names of the facts *host* was asked for (not their values)."""
    state = host.state
    if not _reads(state, host.name):
        return  # nothing asked (e.g. a failed connection): keep the previous list
    path = reads_file(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(_reads(state, host.name).values())))
    os.replace(tmp, path)


@functools.cache
def _fact_class(name: str):
    """The fact class named ``module:qualname`` (looked up once: an import, even of a
    loaded module, takes the import lock, a gevent lock under pyinfra)."""
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def shares_shell(cls, command: str) -> bool:
    """Whether *command* (the fact *cls*'s) may run in the batch's own shell rather than
    a subshell of its own (one process fewer, about a third of a millisecond each on a
    busy node): our facts that say so (``shares_shell``: the command never changes
    directory, options or traps, never exits, and sets every variable before reading
    it), the stand-ins of :data:`CHEAPER_COMMANDS` and ``command -v NAME || true``.
    tests/unit/test_accel_memo.py runs each with its variables set beforehand."""
    return (getattr(cls, "shares_shell", False) is True
            or command in _CHEAPER_TEXTS or bool(_COMMAND_V.match(command)))


_CHEAPER_TEXTS = frozenset(CHEAPER_COMMANDS.values())
_COMMAND_V = re.compile(r"^command -v [A-Za-z0-9._+-]+ \|\| true$")


def batch_command(parts: list[tuple]) -> str:
    """One shell script running each fact command between markers, in a subshell of its
    own unless the part says it shares the shell: ``(index, command, requires[,
    shared])``."""
    from pyinfra.api.facts import _MISSING_COMMAND_MARKER

    lines = []
    for index, command, requires, *shared in parts:
        body = f"{{ {command}\n}}" if shared and shared[0] else f"( {command}\n)"
        if requires:
            body = (f"if command -v {requires} >/dev/null 2>&1; then {body}; "
                    f"else echo '{_MISSING_COMMAND_MARKER}'; fi")
        lines.append(f"echo '{_MARK} {index} begin'; {body} 2>/dev/null; "
                     f"echo \"{_MARK} {index} rc $?\"")
    return "\n".join(lines)


#: The first line of a packed answer (:func:`packed`); the next is the whole output.
_PACKED = f"{_MARK} gzip"


def packed(script: str) -> str:
    """*script* run so that its whole output comes back as one line (gzip, then
    base64), where the node has both; as it is elsewhere. The deploying machine handles
    an answer line by line (a few hundred per node, most of them the package list),
    while one line and a decompression cost it next to nothing."""
    return (
        f"_aicluster_facts() {{\n{script}\n}}\n"
        "if command -v gzip >/dev/null 2>&1 && command -v base64 >/dev/null 2>&1; then "
        f"echo '{_PACKED}'; _aicluster_facts | gzip -1 | base64 -w 0; echo; "
        "else _aicluster_facts; fi"
    )


def unpacked(lines: list[str]) -> list[str]:
    """The output lines of :func:`packed`'s script, as pyinfra gives a command's
    (split at each newline, no trailing newline). Raises ValueError when a packed
    answer is cut off or not UTF-8."""
    if not lines or lines[0] != _PACKED:
        return lines
    try:
        text = zlib.decompress(base64.b64decode("".join(lines[1:]), validate=True),
                               wbits=31).decode("utf-8")
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"a packed fact answer that cannot be read: {exc}") from None
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return out


def split_output(lines: list[str]) -> dict[int, tuple[int, list[str]]]:
    """``{index: (exit code, stdout lines)}`` from the batch's output."""
    out: dict[int, tuple[int, list[str]]] = {}
    current: int | None = None
    buffer: list[str] = []
    for line in lines:
        # (the prefix first: most lines are answers, and a regex call each costs more)
        match = _MARK_RE.match(line) if line.startswith(_MARK) else None
        if not match:
            if current is not None:
                buffer.append(line)
            continue
        index = int(match.group(1))
        if match.group(2) == "begin":
            current, buffer = index, []
        elif current == index:
            out[index] = (int(match.group(3)), buffer)
            current = None
    return out


_SIGNATURES: dict[type, inspect.Signature] = {}


def _command_signature(fact) -> inspect.Signature:
    """The signature of the fact's ``command`` as called (worked out once per fact
    class: every host prefetches the same facts)."""
    cls = type(fact)
    if cls not in _SIGNATURES:
        _SIGNATURES[cls] = inspect.signature(fact.command)
    return _SIGNATURES[cls]


def _fact_kwargs(fact, args, kwargs) -> dict[str, Any]:
    """The arguments the fact's command takes, by name (what pyinfra's own
    ``_handle_fact_kwargs`` gives, without working out every connector argument)."""
    if not args and not kwargs:
        return {}
    bound = _command_signature(fact).bind(*(args or ()), **(kwargs or {}))
    bound.apply_defaults()
    return dict(bound.arguments)


class _StatGroup:
    """pyinfra's File, Directory, Link and Socket facts for many paths in one ``stat``
    (each fact's own command runs ``stat`` once per path). Each path's line is the one
    its own command prints; a path stat cannot find has none (its fact's default).
    ``/`` is asked first: a ``stat`` without ``-c`` (BSD's) prints no line for it, and
    then nothing is taken from this and the facts are read one by one, each falling
    back as its own command does (``stat -c``, else ``stat -f``)."""

    process_needs_command = False

    @staticmethod
    def key(cls, fact_kwargs: dict) -> str | None:
        return _plain_path(fact_kwargs)

    @staticmethod
    def command(paths: list[str]) -> str:
        from pyinfra.facts.files import LINUX_STAT_COMMAND

        fmt = LINUX_STAT_COMMAND.split("'")[1]
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"stat -c '{_MARK}%n{_MARK} {fmt}' -- / {quoted} 2>/dev/null; "
                f"echo '{_MARK}done'")

    @staticmethod
    def split(lines: list[str], keys: list[str]) -> dict[str, list[str]] | None:
        if f"{_MARK}done" not in lines or not any(
                line.startswith(f"{_MARK}/{_MARK} ") for line in lines):
            return None
        out = {}
        for line in lines:
            if line.startswith(_MARK) and line != f"{_MARK}done":
                path, _, rest = line[len(_MARK):].partition(f"{_MARK} ")
                out[path] = [rest]
        return out


class _Sha1Group:
    """pyinfra's Sha1File for many paths in one ``sha1sum``: each path's line is the
    one its own command prints (``<sha1>  <path>``); a missing file has none."""

    #: Sha1File's ``process`` reads the path its ``command`` stored on the fact.
    process_needs_command = True

    @staticmethod
    def key(cls, fact_kwargs: dict) -> str | None:
        return _plain_path(fact_kwargs)

    @staticmethod
    def command(paths: list[str]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"if command -v sha1sum >/dev/null 2>&1; then "
                f"sha1sum -- {quoted} 2>/dev/null; echo '{_MARK}done'; fi")

    @staticmethod
    def split(lines: list[str], keys: list[str]) -> dict[str, list[str]] | None:
        if f"{_MARK}done" not in lines:
            return None
        out = {}
        for line in lines:
            digest, sep, path = line.partition("  ")
            if sep and len(digest) == 40:
                out[path] = [line]
        return out


class _SystemdGroup:
    """pyinfra's SystemdStatus and SystemdEnabled, and our UnitLoaded, for many units in
    one ``systemctl show`` (each fact's own command runs ``systemctl`` once per unit).
    systemctl prints one block per unit named, in the order named, with the properties
    in its own fixed order whichever were asked for; each fact's lines are its unit's
    block cut to what its own command prints: ``Id`` and ``SubState`` or
    ``UnitFileState`` lines, or the LoadState value alone (UnitLoaded asks
    ``--value``). Keys are ``"<property> <unit>"``."""

    PROPERTIES = ("SubState", "UnitFileState", "LoadState")
    #: Properties whose fact's own command prints the value alone (``--value``).
    VALUE_ONLY = frozenset({"LoadState"})
    process_needs_command = False

    @staticmethod
    def key(cls, fact_kwargs: dict) -> str | None:
        if fact_kwargs.get("user_mode") or fact_kwargs.get("machine") is not None or (
                fact_kwargs.get("user_name") is not None):
            return None
        services = fact_kwargs.get("services", fact_kwargs.get("unit"))
        if isinstance(services, (list, tuple)) and len(services) == 1:
            services = services[0]
        if not isinstance(services, str) or not _PLAIN_UNIT.match(services):
            return None
        prop = getattr(cls, "state_key", None)
        if prop not in _SystemdGroup.PROPERTIES:
            return None
        return f"{prop} {services}"

    @staticmethod
    def _units(keys: list[str]) -> list[str]:
        return list(dict.fromkeys(key.split(" ", 1)[1] for key in keys))

    @staticmethod
    def command(keys: list[str]) -> str:
        units = " ".join(_SystemdGroup._units(keys))
        props = " ".join(f"--property {p}" for p in ("Id", *_SystemdGroup.PROPERTIES))
        return (f"if command -v systemctl >/dev/null 2>&1; then "
                f"systemctl show --all {props} {units} && echo '{_MARK}done'; fi")

    @staticmethod
    def split(lines: list[str], keys: list[str]) -> dict[str, list[str]] | None:
        if not lines or lines[-1] != f"{_MARK}done":
            return None
        blocks: list[list[str]] = [[]]
        for line in lines[:-1]:
            if line.strip():
                blocks[-1].append(line)
            else:
                blocks.append([])
        blocks = [b for b in blocks if b]
        units = _SystemdGroup._units(keys)
        if len(blocks) != len(units) or any(not b[0].startswith("Id=") for b in blocks):
            return None
        by_unit = dict(zip(units, blocks, strict=True))
        out = {}
        for key in keys:
            prop, unit = key.split(" ", 1)
            if prop in _SystemdGroup.VALUE_ONLY:
                out[key] = [line.split("=", 1)[1] for line in by_unit[unit]
                            if line.split("=", 1)[0] == prop]
            else:
                out[key] = [line for line in by_unit[unit]
                            if line.split("=", 1)[0] in ("Id", prop)]
        return out


#: Facts read together, one command per kind, when their path (or unit) is plain.
GROUPED = {"stat": _StatGroup, "sha1": _Sha1Group, "systemd": _SystemdGroup}
_GROUP_OF = {
    "pyinfra.facts.files:File": "stat", "pyinfra.facts.files:Directory": "stat",
    "pyinfra.facts.files:Link": "stat", "pyinfra.facts.files:Socket": "stat",
    "pyinfra.facts.files:Sha1File": "sha1",
    "pyinfra.facts.systemd:SystemdStatus": "systemd",
    "pyinfra.facts.systemd:SystemdEnabled": "systemd",
    "aicluster.common.facts:UnitLoaded": "systemd",
}
#: A path read in a group: absolute, and nothing stat or sha1sum would print quoted
#: or escaped, nor the group's own mark.
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._+,:=@%/ -]*$")
#: A unit read in a group: a valid unit name systemctl prints as it is (no escapes).
_PLAIN_UNIT = re.compile(
    r"^[A-Za-z0-9:_][A-Za-z0-9:_.@-]*\.(service|socket|timer|target|mount|path)$")


def _plain_path(fact_kwargs: dict) -> str | None:
    """The fact's path, when it is plain enough to be read in a group."""
    path = fact_kwargs.get("path")
    if (isinstance(path, str) and _PLAIN_PATH.match(path) and "@@" not in path
            and "  " not in path):
        return path
    return None


def _group_of(cls, fact_kwargs: dict) -> tuple[str | None, str | None]:
    """``(kind, key)`` of a fact read in a group, or ``(None, None)``."""
    kind = _GROUP_OF.get(f"{cls.__module__}:{cls.__qualname__}")
    if kind is None:
        return None, None
    return kind, GROUPED[kind].key(cls, fact_kwargs)


def _await_prefetch(state, host) -> bool:
    """Wait while *host*'s one-command read is under way (another host's deploy may ask
    for this host's facts, e.g. Slurm's cgroup check of every node). True if it waited.
    The read itself, making the command of a fact that reads another (pyinfra's
    ``Mounts`` reads the kernel), does not wait for itself."""
    pending, reader = state.__dict__.get("aicluster_prefetching", {}).get(host.name,
                                                                          (None, None))
    if pending is None or pending.is_set() or reader is _current():
        return False
    pending.wait()
    return True


def prefetch_facts(host) -> int:
    """Read, in one command, every fact *host* was asked for in the previous run and
    put the answers in the memo. Returns how many were prefetched. Reads of this host's
    facts asked for meanwhile (by other hosts' deploys) wait for it."""
    import gevent.event

    pending = gevent.event.Event()
    # (the event, and the greenlet reading, which never waits for itself)
    host.state.__dict__.setdefault("aicluster_prefetching", {})[host.name] = (
        pending, _current())
    try:
        return _prefetch(host)
    finally:
        pending.set()


def _prefetch(host) -> int:
    from pyinfra.api.command import StringCommand
    from pyinfra.api.facts import _MISSING_COMMAND_MARKER

    state = host.state
    path = reads_file(host)
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    wanted = []
    grouped: dict[str, dict[str, list[int]]] = {}
    parts = []
    plans = state.__dict__.setdefault("aicluster_prefetch_plans", {})
    for index, entry in enumerate(entries):
        # Hosts are mostly asked the same reads: each read's plan is worked out once.
        text = repr(entry)
        plan = plans.get(text)
        if plan is None:
            asked = _ASKED[0]
            plan = _read_plan(entry)
            if _ASKED[0] == asked:  # its command read no fact of this host: everyone's
                plans[text] = plan
        if plan is _NOT_PREFETCHED:
            continue
        cls, fact, kind, key, command, requires, shared = plan
        try:
            if fact.check_preconditions(state, host):
                continue
        except Exception:  # read it the normal way
            continue
        _name, args, kwargs = entry
        wanted.append((index, cls, fact, args, kwargs))
        if kind is not None:  # read with its kind in one command: not its own
            grouped.setdefault(kind, {}).setdefault(key, []).append(index)
        else:
            parts.append((index, command, requires, shared))
    if not wanted:
        return 0
    group_index = {}
    for n, (kind, items) in enumerate(grouped.items()):
        group_index[kind] = len(entries) + n
        parts.append((group_index[kind], GROUPED[kind].command(list(items)), None, True))
    script = packed(batch_command(parts))
    status, output = host.run_shell_command(StringCommand(script))
    if not status:
        return 0
    try:
        results = split_output(unpacked(output.stdout_lines))
    except ValueError:  # read the normal way
        return 0
    for kind, items in grouped.items():
        rc, lines = results.get(group_index[kind], (1, []))
        answers = GROUPED[kind].split(lines, list(items)) if rc == 0 else None
        if answers is None:  # not memoized: read the normal way
            continue
        for key, indexes in items.items():
            for index in indexes:
                results[index] = (0, answers.get(key, []))
    memo = _memo(state, host.name)
    done = 0
    for index, cls, fact, args, kwargs in wanted:
        if index not in results:
            continue
        rc, lines = results[index]
        if rc != 0 or lines == [_MISSING_COMMAND_MARKER]:
            continue
        try:
            value = _processed(state, cls, fact, lines) if lines else fact.default()
        except Exception:
            continue
        key = fact_key(host, cls, args, kwargs)
        if key is not None:
            memo.setdefault(key, value)
            done += 1
    return done


#: The plan of a read that is not prefetched (read the normal way when asked).
_NOT_PREFETCHED = object()


def _read_plan(entry) -> tuple | object:
    """How a remembered read is prefetched: ``(cls, fact, kind, key, command, requires,
    shares_shell)``, with *fact* the instance whose ``command`` made the text (its
    ``process`` may need what ``command`` kept, e.g. ``Sha1File``'s path), *kind* and
    *key* those of a grouped read (then no command of its own); or
    :data:`_NOT_PREFETCHED` for a fact renamed or gone since, or one whose command is
    not plain text. The same for every host asked the read, unless the fact's command
    reads another fact of the host (e.g. pyinfra's ``Mounts`` reads its kernel)."""
    from pyinfra.api.command import StringCommand
    from pyinfra.api.facts import _make_command

    try:
        name, args, kwargs = entry
        cls = _fact_class(name)
        fact = cls()
        fact_kwargs = _fact_kwargs(fact, args, kwargs)
        kind, key = _group_of(cls, fact_kwargs)
        if key is not None:
            if GROUPED[kind].process_needs_command:
                fact.command(**fact_kwargs)
            return (cls, fact, kind, key, None, None, True)
        command = _make_command(fact.command, dict(fact_kwargs))
        requires = _make_command(fact.requires_command, dict(fact_kwargs))
    except Exception:
        return _NOT_PREFETCHED
    if isinstance(command, StringCommand):
        command = command.get_raw_value()
    if not isinstance(command, str) or (requires is not None and not isinstance(
            requires, str)):
        return _NOT_PREFETCHED
    command = CHEAPER_COMMANDS.get(command, command)
    command = CHEAPER_PARSED.get((name, command), command)
    return (cls, fact, None, None, command, requires, shares_shell(cls, command))


def _processed(state, cls, fact, lines: list[str]) -> Any:
    """``fact.process(lines)``; once per run for each output of a :data:`SHARED_PROCESS`
    fact (the memo hands out copies, so hosts sharing the answer cannot alter it)."""
    name = f"{cls.__module__}:{cls.__qualname__}"
    if name not in SHARED_PROCESS:
        return fact.process(lines)
    cache = state.__dict__.setdefault("aicluster_processed", {})
    key = (name, tuple(lines))
    if key not in cache:
        cache[key] = fact.process(lines)
    return cache[key]


def remember_reads(state) -> None:
    """Save each host's reads when pyinfra disconnects from it, after its operations
    ran (with ``-y`` pyinfra reads operations' facts only while executing them)."""
    from pyinfra.api.state import BaseStateCallback

    if state.__dict__.get("aicluster_remembering"):
        return

    class SaveReads(BaseStateCallback):
        @staticmethod
        def host_disconnect(state, host):
            from aicluster import dryrun

            if dryrun.is_dry():  # `--dry` writes nothing, on this machine either
                return
            save_reads(host)
            save_stats(state, host.name)

    handler = SaveReads()
    state.add_callback_handler(handler)
    state.__dict__["aicluster_remembering"] = True

    def forget_handler() -> None:
        handlers = getattr(state, "callback_handlers", None)
        if isinstance(handlers, list) and handler in handlers:
            handlers.remove(handler)
        state.__dict__.pop("aicluster_remembering", None)

    PATCHES.on_undo(forget_handler)
