"""Reading ``nvidia-smi -q`` (text or ``-x`` XML) into entries: (path, value, line) per GPU.

A path is the lower-case chain of section and key names, ``pci/gpu link info/pcie generation/max``
in the text form and ``pci/pci_gpu_link_info/pcie_gen/max_link_gen`` in the XML form; the
fields gpud reads are looked up under either (``gpud.sim.dump.fields``). Nothing here knows what
a field means: only where it is and on which line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from gpud.errors import InvalidInput
from gpud.paths import read_limited

MAX_BYTES = 16 << 20  # nvidia-smi -q of 16 GPUs is under 2 MiB; a larger file is something else
HEADER = "==============NVSMI LOG=============="
GPU_LINE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


def fail(file: str, line: int, reason: str) -> InvalidInput:
    """``file:line: reason`` (exit code 2)."""
    return InvalidInput(f"{file}:{line}", "", reason)


@dataclass
class Entry:
    path: str
    value: str
    line: int


@dataclass
class GpuDump:
    bus_id: str  # as printed: 00000000:4F:00.0
    line: int  # where the GPU's section starts
    entries: list[Entry] = field(default_factory=list)
    _index: dict[str, Entry] | None = None

    def find(self, path: str) -> Entry | None:
        """The first entry at ``path`` (lower case)."""
        if self._index is None:
            self._index = {}
            for e in self.entries:
                self._index.setdefault(e.path, e)
        return self._index.get(path)


@dataclass
class Dump:
    file: str
    form: str  # "text" or "xml"
    driver_version: Entry | None
    cuda_version: Entry | None
    attached: Entry | None
    gpus: list[GpuDump]
    last_line: int


def read_capped(path: Path, file: str) -> str:
    """The file's text, refusing one larger than ``MAX_BYTES`` without reading it whole."""
    raw = read_limited(path, MAX_BYTES, f"{file}:1",
                       too_large=f"larger than {MAX_BYTES >> 20} MiB: not the output of nvidia-smi")
    if b"\0" in raw[:4096]:
        raise fail(file, 1, "binary data: not the output of nvidia-smi")
    return raw.decode("utf-8", errors="replace").replace("\r\n", "\n")


def looks_like_xml(text: str) -> bool:
    head = text.lstrip()[:400]
    return head.startswith("<?xml") or "<nvidia_smi_log" in head


def what_else(text: str) -> str:
    """A guess at what a file without the -q header is, for the error message."""
    if re.search(r"^\s*GPU0\s", text, re.M) and ("NV" in text or "Legend" in text or "Affinity" in text):
        return "this is `nvidia-smi topo -m` output: pass it with --topo"
    if "NVIDIA-SMI" in text and ("|" in text or "+-" in text):
        return "this is nvidia-smi's summary table: run `nvidia-smi -q` instead"
    if re.search(r"^\s*[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] ", text, re.M):
        return "this looks like lspci output: run `nvidia-smi -q` instead"
    if "couldn't communicate with the NVIDIA driver" in text or "NVIDIA-SMI has failed" in text:
        return "nvidia-smi could not reach the driver on that machine: nothing to import"
    if "No devices were found" in text:
        return "nvidia-smi found no GPUs on that machine: nothing to import"
    return "not the output of `nvidia-smi -q`"


def parse_text(text: str, file: str) -> Dump:
    lines = text.split("\n")
    start = next((k for k, raw in enumerate(lines) if raw.strip() == HEADER), None)
    if start is None:
        first = next((k for k, raw in enumerate(lines) if raw.strip()), 0)
        raise fail(file, first + 1, f"no '{HEADER}' line: {what_else(text)}")
    top: dict[str, Entry] = {}
    gpus: list[GpuDump] = []
    stack: list[tuple[int, str]] = []
    current: GpuDump | None = None
    for k in range(start + 1, len(lines)):
        raw = lines[k].rstrip()
        no = k + 1
        if not raw.strip():
            continue
        if raw.startswith("```"):  # the end of a pasted block
            break
        m = GPU_LINE.match(raw)
        if m:
            current = GpuDump(m.group(1), no)
            gpus.append(current)
            stack = []
            continue
        indent = len(raw) - len(raw.lstrip(" \t"))
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        if current is None:
            if indent == 0 and sep:
                top[key.lower()] = Entry(key.lower(), value, no)
                continue
            if raw.strip() == HEADER:
                continue
            raise fail(file, no, f"expected 'GPU <bus id>' or 'Key : value', found {raw.strip()[:60]!r}")
        if indent == 0:
            if not any(GPU_LINE.match(rest) for rest in lines[k + 1:]):
                break  # text pasted after the dump (a shell prompt, a second command's output)
            raise fail(file, no, f"expected an indented field of GPU {current.bus_id}, "
                                 f"found {raw.strip()[:60]!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s for _, s in stack] + [key.lower()])
        if sep and value:
            current.entries.append(Entry(path, value, no))
        else:
            stack.append((indent, key.lower()))
            current.entries.append(Entry(path, "", no))
    return Dump(file, "text", top.get("driver version"), top.get("cuda version"), top.get("attached gpus"),
                gpus, len(lines))


def parse_xml(text: str, file: str) -> Dump:
    """``nvidia-smi -q -x``: leaf elements become entries, ``<gpu id="…">`` a GPU."""
    parser = expat.ParserCreate()
    top: dict[str, Entry] = {}
    gpus: list[GpuDump] = []
    tags: list[str] = []
    texts: list[list[str]] = []
    children: list[int] = []
    state: dict[str, GpuDump | None] = {"gpu": None}

    def start(tag: str, attrs: dict[str, str]) -> None:
        if children:
            children[-1] += 1
        tags.append(tag.lower())
        texts.append([])
        children.append(0)
        if tag == "gpu" and len(tags) == 2:
            bus = attrs.get("id", "")
            if not re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", bus):
                raise fail(file, parser.CurrentLineNumber, f"<gpu id={bus!r}>: not a PCI bus id")
            gpu = GpuDump(bus, parser.CurrentLineNumber)
            state["gpu"] = gpu
            gpus.append(gpu)

    def end(tag: str) -> None:
        value = "".join(texts.pop()).strip()
        had_children = children.pop()
        gpu = state["gpu"]
        if len(tags) == 2 and tags[0] == "nvidia_smi_log" and tag != "gpu" and not had_children:
            top[tags[1].replace("_", " ")] = Entry(tags[1], value, parser.CurrentLineNumber)
        elif gpu is not None and len(tags) > 2:
            path = "/".join(tags[2:])
            gpu.entries.append(Entry(path, "" if had_children else value, parser.CurrentLineNumber))
        if tag == "gpu" and len(tags) == 2:
            state["gpu"] = None
        tags.pop()

    def chars(data: str) -> None:
        if texts:
            texts[-1].append(data)

    def no_dtd(*_: object) -> None:
        raise fail(file, parser.CurrentLineNumber, "a DTD with declarations or an entity (<!DOCTYPE … [ … ]>, "
                                                   "<!ENTITY>, &name;): `nvidia-smi -q -x` writes none; refused")

    def doctype(name: str, system_id: str | None, public_id: str | None, internal: int) -> None:
        if internal:  # nvidia-smi writes only <!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vN.dtd">
            no_dtd()

    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = no_dtd
    parser.ExternalEntityRefHandler = lambda *_: no_dtd() or 0  # type: ignore[func-returns-value]
    parser.SkippedEntityHandler = no_dtd
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(text, True)
    except expat.ExpatError as err:
        reason = expat.errors.messages.get(err.code, str(err)) if hasattr(err, "code") else str(err)
        raise fail(file, err.lineno, f"not well-formed XML ({reason}): a truncated or damaged "
                                     "`nvidia-smi -q -x`") from err
    if not gpus and "driver version" not in top:
        raise fail(file, 1, "XML without <nvidia_smi_log>: not the output of `nvidia-smi -q -x`")
    return Dump(file, "xml", top.get("driver version"), top.get("cuda version"), top.get("attached gpus"),
                gpus, parser.CurrentLineNumber)


def read_dump(path: Path, file: str, xml: bool | None = None) -> Dump:
    """Parse a dump; ``xml`` None: decide by its first bytes."""
    text = read_capped(path, file)
    if xml is None:
        xml = looks_like_xml(text)
    elif xml and not looks_like_xml(text):
        raise fail(file, 1, "--xml given but this is not XML (`nvidia-smi -q -x` starts with '<?xml')")
    dump = parse_xml(text, file) if xml else parse_text(text, file)
    if not dump.gpus:
        line = dump.attached.line if dump.attached else dump.last_line
        raise fail(file, line, "no GPU section in the dump (nothing to import)")
    return dump
