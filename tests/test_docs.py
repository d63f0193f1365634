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


# -- the quickstart as getting-started.md, local.md and mirror.md run it ---------------------------
#
# One working directory laid out like a checkout (``.venv`` and ``examples/quickstart``), where the
# blocks run as written, one after the other, as a reader goes through the three pages: the
# quickstart started with ``reptables up`` and driven with the yt CLI, the mirror of its ``events``
# into the run's PostgreSQL server, then ``up`` started again on the same data directory and
# local.md's commands. The only change to what a reader has: the quickstart's engines listen on free
# ports instead of 9012-9014 (its tableclusters.yaml is copied with them), since other tests run
# engines beside these; the blocks themselves name no port (``reptables env`` gives it).

QUICKSTART_PORTS = ("9012", "9013", "9014")


class Checkout:
    """The working directory of the quickstart blocks, and the long-running blocks started in it."""

    def __init__(self, root: Path) -> None:
        import os

        self.root = root
        (root / ".venv").symlink_to(ROOT / ".venv")
        quickstart = root / "examples" / "quickstart"
        quickstart.mkdir(parents=True)
        base = _free_ports(3)
        self.ports = {name: base + i for i, name in enumerate(("primary", "remote-0", "remote-1"))}
        for source in sorted((ROOT / "examples" / "quickstart").glob("*.yaml")):
            text = source.read_text()
            for i, port in enumerate(QUICKSTART_PORTS):
                text = text.replace(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{base + i}")
            (quickstart / source.name).write_text(text)
        # local.md's blocks expect .venv/bin on the PATH
        self.env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
        for name in ("YT_PROXY", "YT_TOKEN", "PGHOST", "PGPORT", "PGPASSWORD", "PGUSER", "PGDATABASE"):
            self.env.pop(name, None)
        self.background: list[subprocess.Popen[bytes]] = []

    def use_postgres(self, postgres: Any) -> None:
        """mirror.md's blocks read PGHOST, PGPORT and PSQL (a superuser's psql): the run's server."""
        self.env.update({"PGHOST": postgres.host, "PGPORT": str(postgres.port),
                         "PSQL": f"psql -X -h {postgres.host} -p {postgres.port} -U reptables -d postgres"})

    def run(self, page: str, name: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a block to its end; fail with its output unless it exits 0."""
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_block(page, name)], cwd=self.root,
                                env=self.env, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"docs/{page} block {name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def start(self, page: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a block that runs until stopped (as in a terminal of its own): its process, its log."""
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", doc_block(page, name)], cwd=self.root,
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.background.append(proc)
        return proc, log

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], signum: int) -> int:
        """Send ``signum`` to a started block's process group (as Ctrl-C or a service manager would)."""
        import contextlib
        import os

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        return proc.wait(timeout=90)

    def wait_on(self, proc: subprocess.Popen[bytes], log: Path, check: Any, timeout: float, what: str) -> Any:
        """:func:`wait_for` ``check()``; fails at once, with the block's output, if the block ends first."""
        from reptables.testing import WaitTimeout, wait_for

        def seen() -> Any:
            value = check()
            if not value and proc.poll() is not None:
                pytest.fail(f"the block ended ({proc.returncode}) waiting for {what}:\n"
                            f"{log.read_text(errors='replace')[-4000:]}")
            return value

        try:
            return wait_for(seen, timeout, what, interval=0.5)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")

    def client(self, cluster: str) -> Any:
        from reptables.engine.client import Client

        return Client(f"http://127.0.0.1:{self.ports[cluster]}", f"change-me-{cluster}")

    def up_pids(self) -> list[int]:
        import json

        state = json.loads((self.root / ".data" / "local" / "state.json").read_text())
        return [int(e["pid"]) for e in state["engines"].values() if e.get("pid")]

    def close(self) -> None:
        import signal

        for proc in self.background:
            if proc.poll() is None:
                self.stop(proc, signal.SIGTERM)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Any:
    place = Checkout(tmp_path_factory.mktemp("checkout"))
    try:
        yield place
    finally:
        place.close()


def _events(checkout: Checkout) -> list[dict[str, Any]]:
    with checkout.client("primary") as client:
        return sorted(client.select_rows("* from [//home/quickstart/events]"), key=lambda r: r["id"])


@pytest.mark.timeout(600)
def test_getting_started_runs_the_quickstart_as_written(checkout: Checkout) -> None:
    """getting-started.md: ``reptables up my-quickstart --keep-running``, then the yt CLI against it."""
    up, log = checkout.start("getting-started.md", "quickstart-up")
    checkout.wait_on(up, log, lambda: "reconciling every second" in log.read_text(errors="replace"), 240,
                     "reptables up to converge")
    out = log.read_text(errors="replace")
    assert "wrote 1000 rows to primary://home/quickstart/events with yt.wrapper" in out
    assert "replica events-remote-1 on remote-1 (async): 1000 rows" in out
    assert (checkout.root / ".data" / "local" / "demo.json").exists()

    result = checkout.run("getting-started.md", "quickstart-yt")
    lines = result.stdout.splitlines()
    assert '{"id":0,"kind":"kind-0","payload":"payload-0"}' in lines
    # the last line: the lookup on remote-1's replica finds the row the block inserted on primary
    assert lines[-1] == '{"id":5000,"kind":"hello","payload":"from the yt CLI"}', result.stdout[-2000:]
    assert '"mode":"sync"' in result.stdout.replace(" ", "")  # the @replicas of events


@pytest.mark.timeout(600)
def test_the_mirror_of_the_quickstart_events_runs_as_written_and_holds_its_position(checkout: Checkout,
                                                                                     postgres: Any) -> None:
    """mirror.md on the quickstart's replicated table ``events`` (``minReplicationLogTtl: 0s``): the
    PostgreSQL setup, the mirror, changes with the yt CLI, the read in PostgreSQL, the release.

    The queue of ``events`` is trimmed a moment after both replicas have a change; a mirror that held
    no position failed then with error 1760 (its position older than the changes the table keeps).
    Here it keeps up across a quiet spell longer than that, and its copy ends equal to the table."""
    import signal
    import time

    import psycopg

    checkout.use_postgres(postgres)
    checkout.run("mirror.md", "mirror-pg-setup")
    mirror, log = checkout.start("mirror.md", "mirror-quickstart-run")
    dsn = f"host={postgres.host} port={postgres.port} dbname=mirror user=mirror"

    def pg_rows() -> list[dict[str, Any]] | None:
        try:
            with psycopg.connect(dsn, connect_timeout=10) as conn:
                rows = conn.execute("SELECT id, kind, payload FROM events ORDER BY id").fetchall()
        except psycopg.errors.UndefinedTable:
            return None
        return [{"id": r[0], "kind": r[1], "payload": r[2]} for r in rows]

    checkout.wait_on(mirror, log, lambda: "copied the snapshot" in log.read_text(errors="replace"), 240,
                     "the snapshot copy")
    assert len(pg_rows() or []) == 1001  # the demo's 1000 and getting-started's id 5000

    checkout.run("mirror.md", "mirror-quickstart-change")
    checkout.wait_on(mirror, log, lambda: pg_rows() == _events(checkout), 60, "the changes in PostgreSQL")
    with checkout.client("remote-1") as replica:  # the async replica has them: the queue may trim them now
        checkout.wait_on(mirror, log, lambda: replica.lookup_rows("//home/quickstart/events", [{"id": 8}])
                         == [{"id": 8, "kind": "edited", "payload": "by hand"}], 30, "the change on remote-1")
    time.sleep(3)  # three passes of the meta-cluster's queue trimming (once a second), with no change
    assert mirror.poll() is None, log.read_text(errors="replace")[-4000:]
    with checkout.client("primary") as client:
        client.insert_rows("//home/quickstart/events", [{"id": 5001, "kind": "late", "payload": "after a pause"}])
    checkout.wait_on(mirror, log, lambda: pg_rows() == _events(checkout), 60, "the change after the pause")

    read = checkout.run("mirror.md", "mirror-quickstart-read")
    assert [line.split("|")[0].strip() for line in read.stdout.splitlines() if "|" in line][1:] == ["6", "8", "9"]
    assert "edited  | by hand" in read.stdout or "edited | by hand" in read.stdout, read.stdout

    with checkout.client("primary") as client:
        [held] = client.list_queue_consumer_registrations("//home/quickstart/events")
        assert held["vital"] and held["consumer_path"].startswith("//consumers/reptables-mirror/events-")
    assert checkout.stop(mirror, signal.SIGINT) == 0, log.read_text(errors="replace")[-4000:]  # Ctrl-C
    assert "stopped" in log.read_text(errors="replace")
    released = checkout.run("mirror.md", "mirror-quickstart-release")
    assert "unregistered consumer //consumers/reptables-mirror/events-" in released.stderr
    with checkout.client("primary") as client:
        assert client.list_queue_consumer_registrations("//home/quickstart/events") == []


@pytest.mark.timeout(600)
def test_local_md_runs_as_written_on_the_same_data_directory(checkout: Checkout) -> None:
    """local.md: ``up`` started again on the directory of getting-started's (it resumes and writes no
    demo rows over the user's changes), then status, env, cluster stop|start, disable|enable, promote."""
    import json
    import os
    import signal

    first = checkout.background[0]
    with checkout.client("primary") as client:  # the user's own changes to demo rows
        client.delete_rows("//home/quickstart/events", [{"id": 11}])
        client.insert_rows("//home/quickstart/events", [{"id": 12, "kind": "mine", "payload": "kept"}])
    before = _events(checkout)
    assert not any(r["id"] == 11 for r in before) and {"id": 12, "kind": "mine", "payload": "kept"} in before
    pids = checkout.up_pids()
    checkout.stop(first, signal.SIGTERM)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    up, log = checkout.start("local.md", "local-up")
    checkout.wait_on(up, log, lambda: "reconciling every second" in log.read_text(errors="replace"), 240,
                     "reptables up to resume")
    out = log.read_text(errors="replace")
    assert "wrote 1000 rows" not in out and "demo: not written again: .data/local was used before" in out, out
    assert _events(checkout) == before  # the deleted row stays deleted, the changed ones keep their values

    status = checkout.run("local.md", "local-status")
    assert "events-remote-0" in status.stdout and '"syncReplicas"' in status.stdout
    env = checkout.run("local.md", "local-env")
    assert '{"id":0,"kind":"kind-0","payload":"payload-0"}' in env.stdout.splitlines()
    cluster = checkout.run("local.md", "local-cluster")
    assert "engine remote-0" in cluster.stdout and "started again" in cluster.stdout, cluster.stdout

    def healthy() -> bool:
        view = subprocess.run(["reptables", "status", "-o", "json"], cwd=checkout.root, env=checkout.env,
                              capture_output=True, text=True, timeout=60)
        return view.returncode == 0 and all(c["healthy"] for c in json.loads(view.stdout)["clusters"])

    checkout.wait_on(up, log, healthy, 60, "remote-0 healthy again")


@pytest.mark.timeout(300)
def test_local_md_replica_edits_run_as_written(checkout: Checkout) -> None:
    """local.md's ``reptables disable|enable|promote`` against the ``up`` of the test before: each edits
    the replica's manifest in place, and the running ``up`` takes it."""
    commands = subprocess.run(["reptables", "--help"], env=checkout.env, capture_output=True, text=True, timeout=60)
    assert "promote" in commands.stdout, (
        "`reptables` has no command promote: operator/cli.py must mount reptables.operator.local.edits "
        "(`register(app)`)")
    toggled = checkout.run("local.md", "local-disable-enable")
    assert ("tablereplica.reptables.io/events-remote-1 edited: spec.enabled: false in my-quickstart/tablereplicas.yaml"
            " (disable)") in toggled.stdout, toggled.stdout + toggled.stderr
    assert "edited: spec.enabled: true in my-quickstart/tablereplicas.yaml (enable)" in toggled.stdout
    promoted = checkout.run("local.md", "local-promote")
    assert ('tablereplica.reptables.io/events-remote-1 edited: spec.mode: "sync" in my-quickstart/tablereplicas.yaml'
            " (promote to sync)") in promoted.stdout, promoted.stdout + promoted.stderr
    assert "the tracker of ReplicatedTable default/events owns this replica's mode" in promoted.stderr
    import yaml

    manifests = [d for d in yaml.safe_load_all((checkout.root / "my-quickstart" / "tablereplicas.yaml").read_text())
                 if d]
    replica = next(d for d in manifests if d["metadata"]["name"] == "events-remote-1")
    assert replica["spec"]["mode"] == "sync" and replica["spec"]["enabled"] is True


# -- getting-started.md's second tour: the meta-cluster's leader killed under writes ------------------


@pytest.mark.timeout(600)
def test_the_second_tour_kills_the_meta_clusters_leader_under_writes_as_written(tmp_path: Path,
                                                                                 postgres: Any) -> None:
    """getting-started.md, "A second tour": the database made with the reader's psql, ``reptables up``
    with examples/ha/tableclusters.yaml over the quickstart (primary as two engines over PostgreSQL), the
    status naming the leader, the writer and the kill (writes go on; the status names the other engine,
    at epoch 2), and every acknowledged write on the meta-cluster and both replicas. As in the
    quickstart's tests, the engines listen on free ports and the database is the run's server."""
    import json
    import re

    from reptables.engine.process import free_port

    checkout = Checkout(tmp_path)
    try:
        members = {"9022": free_port(), "9032": free_port()}
        ports = {"9012": checkout.ports["primary"], "9013": checkout.ports["remote-0"],
                 "9014": checkout.ports["remote-1"], **members}
        text = (ROOT / "examples" / "ha" / "tableclusters.yaml").read_text()
        for port, free in ports.items():
            text = text.replace(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free}")
        text = text.replace("@127.0.0.1:5432/", f"@{postgres.host}:{postgres.port}/")
        (checkout.root / "examples" / "ha").mkdir(parents=True)
        (checkout.root / "examples" / "ha" / "tableclusters.yaml").write_text(text)
        urls = sorted(f"http://127.0.0.1:{p}" for p in members.values())
        checkout.use_postgres(postgres)

        checkout.run("getting-started.md", "ha-tour-database")
        up, log = checkout.start("getting-started.md", "ha-tour-up")
        checkout.wait_on(up, log, lambda: "reconciling every second" in log.read_text(errors="replace"), 300,
                         "reptables up to converge")
        assert "engine primary: 2 engines over postgresql://reptables_ha@" in log.read_text(errors="replace")

        def leadership() -> dict[str, Any]:
            view = subprocess.run([".venv/bin/reptables", "status", "--data-dir", ".data/ha", "-o", "json"],
                                  cwd=checkout.root, env=checkout.env, capture_output=True, text=True, timeout=60)
            assert view.returncode == 0, view.stderr
            return next(c for c in json.loads(view.stdout)["clusters"] if c["name"] == "primary")["leadership"]

        first = checkout.wait_on(up, log, lambda: (lambda lead: lead if lead["standbys"] else None)(leadership()),
                                 60, "a leader and a standby in the status")
        assert sorted([first["leader"], *first["standbys"]]) == urls and first["epoch"] == 1
        assert first["databasePrimary"] == f"{postgres.host}:{postgres.port}"
        status = checkout.run("getting-started.md", "ha-tour-status")
        assert "Leaders and standbys" in status.stdout and f"engine primary: http://127.0.0.1:{ports['9012']} " \
            f"forwards to the leader, {first['leader']}" in status.stdout, status.stdout

        kill = checkout.run("getting-started.md", "ha-tour-kill", timeout=180).stdout
        counts = {int(m[1]): int(m[2]) for m in re.finditer(r"^second +(\d+): (\d+) writes acknowledged$", kill, re.M)}
        assert sorted(counts) == list(range(1, 16)), kill
        summary = re.search(r"^(\d+) writes acknowledged; the longest time without one: ([\d.]+) s$", kill, re.M)
        assert summary is not None, kill
        written = int(summary[1])
        assert written == sum(counts.values())
        assert f"engine primary at {first['leader']}" in kill and "killed (SIGKILL)" in kill, kill
        assert sum(counts[s] for s in range(10, 16)) > 0, f"no write acknowledged after the kill:\n{kill}"
        failed = len(re.findall(r"^write of id \d+: ", kill, re.M))
        assert failed <= 2, kill  # at most the writes in flight at the killed engine
        [row] = [line for line in kill.splitlines() if line.startswith("primary ")]
        new = next(u for u in urls if u != first["leader"])
        assert row.split()[1:3] == [new, "2"], kill
        # up starts the killed engine again: it stands by
        again = checkout.wait_on(up, log, lambda: (lambda lead: lead if lead["standbys"] else None)(leadership()),
                                 60, "the killed engine standing by")
        assert again["leader"] == new and again["standbys"] == [first["leader"]] and again["epoch"] == 2

        check = checkout.run("getting-started.md", "ha-tour-check").stdout
        rows = {m[1]: int(m[2]) for m in re.finditer(r"^(\S+): (\d+) rows$", check, re.M)}
        assert set(rows) == {"primary", "remote-0", "remote-1"} and len(set(rows.values())) == 1, check
        assert written <= rows["primary"] <= written + failed, (written, failed, check)
    finally:
        checkout.close()
