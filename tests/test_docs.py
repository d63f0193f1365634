"""The documentation stays true to the code: a newcomer follows docs/ only, so what it says must hold.

* The field reference of docs/crds.md is generated from the pydantic models (hack/gen-crd-docs);
  a model change without a regenerated page fails here, exactly as stale CRDs fail hack/gen-crds.
* Every relative link of docs/*.md and README.md leads to a file that exists, and a link to a
  heading of a Markdown page leads to a heading that exists (GitHub's anchor rules): a renamed page
  or section must not leave dead links behind.
* docs/failover.svg (drawn by benchmarks/failover_bench.py --plot) is well-formed SVG that browsers
  and GitHub render, and docs/operations.md shows it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "hack" / "gen-crd-docs"
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
SVG_NS = "{http://www.w3.org/2000/svg}"


def run_gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GEN), *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_crd_reference_is_up_to_date() -> None:
    result = run_gen("--check")
    assert result.returncode == 0, f"docs/crds.md is stale; run hack/gen-crd-docs\n{result.stderr}"


def test_gen_crd_docs_check_fails_on_a_stale_page_and_regenerates_it(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = (ROOT / "docs" / "crds.md").read_text()
    stale = page.replace("Let the tracker choose the sync replicas automatically.", "An outdated description.")
    assert stale != page, "the generated reference lacks the tracker option's description"
    (tmp_path / "docs" / "crds.md").write_text(stale)

    check = run_gen("--check", "--root", str(tmp_path))
    assert check.returncode == 1
    assert "stale" in check.stderr and "hack/gen-crd-docs" in check.stderr

    assert run_gen("--root", str(tmp_path)).returncode == 0
    assert (tmp_path / "docs" / "crds.md").read_text() == page  # prose kept, reference regenerated


def test_gen_crd_docs_names_missing_markers(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "crds.md").write_text("# Custom resources\n\nno markers here\n")
    result = run_gen("--check", "--root", str(tmp_path))
    assert result.returncode != 0
    assert "docs/crds.md" in result.stderr and "BEGIN GENERATED REFERENCE" in result.stderr


def test_reference_lists_every_field_of_the_crds() -> None:
    """Every property of every generated CRD (spec and status, nested) appears as a row of the reference."""
    import yaml

    page = (ROOT / "docs" / "crds.md").read_text()

    def paths(node: dict[str, Any], prefix: str) -> list[str]:
        out = []
        for name, sub in node.get("properties", {}).items():
            path = f"{prefix}.{name}"
            out.append(path)
            if prefix == "status" and name == "conditions":
                continue  # described once, in "Condition fields"
            if sub.get("type") == "array" and "properties" in sub.get("items", {}):
                out += paths(sub["items"], f"{path}[]")
            else:
                out += paths(sub, path)
        return out

    for crd_file in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status"):
            for path in paths(schema["properties"][part], part):
                assert f"| `{path}` |" in page, f"{crd_file.name}: {path} is missing from docs/crds.md"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    text = FENCE.sub("", page.read_text())
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page: Path) -> None:
    dead = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            shown = destination.relative_to(ROOT) if destination.is_relative_to(ROOT) else destination
            dead.append(f"{target}: no file {shown}")
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            dead.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)} has dead links:\n" + "\n".join(dead)


def test_new_pages_are_linked_from_getting_started_or_each_other() -> None:
    """A newcomer reaches concepts, operations, the API and the comparison by following links."""
    linked: set[str] = set()
    for page in PAGES:
        for target in _links(page):
            linked.add(Path(target.partition("#")[0]).name)
    for name in ("concepts.md", "operations.md", "api.md", "comparison.md", "failover.svg"):
        assert name in linked, f"no page links to docs/{name}"


def test_failover_plot_is_well_formed_svg() -> None:
    svg = ROOT / "docs" / "failover.svg"
    root = ET.parse(svg).getroot()  # raises on malformed XML
    assert root.tag == f"{SVG_NS}svg"
    assert root.get("viewBox") and root.get("width") and root.get("height")
    texts = " ".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))
    # what the plot promises to show: writes, the kill, the tracker's switch, the lag
    for label in ("commits acknowledged", "kill", "tracker switch", "replication lag", "writes unavailable"):
        assert label in texts, f"docs/failover.svg has no {label!r} label"
    assert list(root.iter(f"{SVG_NS}polyline")), "no lag curve"


def test_failover_plot_renders_from_a_timeline(tmp_path: Path) -> None:
    """The plot writer itself (what `failover_bench.py --plot` runs) gives well-formed SVG, escaping names."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import failover_bench as fb
    finally:
        sys.path.remove(str(ROOT))
    attempts = [(t / 100, t / 100 + 0.002, not 0 <= t < 150, 0 if not 0 <= t < 150 else 105)
                for t in range(-200, 300, 2)]
    timeline = fb.Timeline(1, "a&b", "c<d>", attempts, [(t / 10, float(t % 7) * 100) for t in range(-20, 30)]
                           + [(3.0, None)], first_bad_probe=0.6, switch=1.45, status=1.7, window=(-0.01, 1.52))
    result = fb.Result(fb.Config(), [], {}, {}, {}, [], timelines=[timeline])
    out = tmp_path / "plot.svg"
    assert fb.write_plot(result, out)
    root = ET.parse(out).getroot()
    texts = " ".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))
    assert "c<d>" in texts and "a&b" in texts
    assert "writes unavailable 1.53 s" in texts
    assert "75 x code 105" in texts
    assert not fb.write_plot(fb.Result(fb.Config(), [], {}, {}, {}, []), tmp_path / "none.svg")


def test_gen_crd_docs_runs_as_an_executable() -> None:
    """`hack/gen-crd-docs --check` as the docs say it (its shebang, re-executing with .venv if needed)."""
    result = subprocess.run([str(GEN), "--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr


# -- doc blocks that run as written ----------------------------------------------------------------

#: a bash block marked ``<!-- doc-test: NAME -->`` on the line before its fence runs in these tests
DOC_TEST = re.compile(r"<!-- doc-test: ([\w-]+) -->\n```bash\n(.*?)^```", re.S | re.M)


def doc_block(page: str, name: str) -> str:
    blocks = {m.group(1): m.group(2) for m in DOC_TEST.finditer((ROOT / "docs" / page).read_text())}
    assert name in blocks, f"docs/{page} has no block marked <!-- doc-test: {name} -->"
    return blocks[name]


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports")


def test_the_xdcr_setup_by_hand_runs_as_written(tmp_path: Path) -> None:
    """docs/xdcr.md's three clusters by hand: the group converges, the seed's conflict is logged on
    both sides, and every engine the block started is gone when it ends."""
    block = doc_block("xdcr.md", "xdcr-by-hand")
    port = _free_ports(3)
    env = {**__import__("os").environ, "D": str(tmp_path / "xdcr"), "P": str(port)}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    import json

    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"ROW_TYPE"')]
    assert [(r["ROW_TYPE"], r["DECISION"], r["LOSING_WRITE"]) for r in lines] == [
        ("EXT", "A", "local"), ("EXP", "A", "local"), ("NEW", "A", "local")], result.stdout
    assert {r["KEY"] for r in lines} == {'{"id": 12345}'}
    status = json.loads(result.stdout[result.stdout.index('{\n'):])
    assert status["cluster"] == "sf" and set(status["peers"]) == {"chicago", "nyc"}
    # stopped by pid: nothing listens on the three ports any more
    import socket

    for p in range(port, port + 3):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0, f"an engine still listens on port {p}"
