"""The embedded and cluster objects have the same calls: a program written against
`chronik.open(path)` runs unchanged on `chronik.connect("kafka://...")`. No broker needed: the
classes are compared by introspection (names, kinds, parameters) and by their typed
declarations (the stubs of the extension module, the annotations of `_cluster.py`) for the
shapes of the answers. The only differences allowed are `chronik._cluster.EMBEDDED_ONLY` and
`CLUSTER_ONLY`, which docs/api.md names."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import chronik
from chronik import _chronik, _cluster

SOURCE = Path(__file__).resolve().parent.parent / "python" / "chronik"
API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"

# Protocol methods that are part of an object's interface (others, such as __repr__, every
# object has).
PROTOCOL = {"__enter__", "__exit__", "__iter__", "__next__"}

# Embedded name -> cluster name, for comparing declarations that name the classes.
CLUSTER_NAMES = {
    "Chronik": "Cluster",
    "Producer": "ClusterProducer",
    "PendingSend": "ClusterPendingSend",
    "Consumer": "_ClusterConsumer",
}


def cluster_consumer():
    if not hasattr(_chronik, "_ClusterConsumer"):
        pytest.skip("this build of chronik has no Kafka support")
    return _chronik._ClusterConsumer


def members(cls):
    """Public names (and protocol methods) of a class: "property" or "method" each."""
    found = {}
    for name in dir(cls):
        if name.startswith("_") and name not in PROTOCOL:
            continue
        attribute = inspect.getattr_static(cls, name)
        if isinstance(attribute, property) or inspect.isdatadescriptor(attribute):
            found[name] = "property"
        elif callable(getattr(cls, name)):
            found[name] = "method"
    return found


def parameters(cls, name):
    """A method's parameters after self: (name, kind, default), the default as its repr."""
    signature = inspect.signature(getattr(cls, name))
    listed = list(signature.parameters.values())[1:]
    return [
        (p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for p in listed
    ]


def assert_same_calls(embedded, cluster, embedded_only=frozenset(), cluster_only=frozenset()):
    ours, theirs = members(embedded), members(cluster)
    assert embedded_only <= set(ours), f"not on {embedded.__name__}: {embedded_only - set(ours)}"
    assert cluster_only <= set(theirs), f"not on {cluster.__name__}: {cluster_only - set(theirs)}"
    for name in embedded_only:
        ours.pop(name)
    for name in cluster_only:
        theirs.pop(name)
    assert ours == theirs, (
        f"only on {embedded.__name__}: {sorted(set(ours) - set(theirs))}; "
        f"only on {cluster.__name__}: {sorted(set(theirs) - set(ours))}"
    )
    for name, kind in ours.items():
        if kind == "method":
            assert parameters(embedded, name) == parameters(cluster, name), name


def declarations(path):
    """Per class of the file at `path`: member name -> its declared type (a
    return annotation, a property's, or an annotated attribute's), as source text."""
    tree = ast.parse(path.read_text())
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        declared = found.setdefault(node.name, {})
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                declared[item.target.id] = ast.unparse(item.annotation)
            elif isinstance(item, ast.FunctionDef) and item.returns is not None:
                if item.name.startswith("_") and item.name not in PROTOCOL:
                    continue
                declared[item.name] = ast.unparse(item.returns)
    return found


def normalized(annotation):
    """An annotation with the embedded class names in place of the cluster ones."""
    text = annotation.strip("'\"").replace("_chronik.", "")
    for embedded, cluster in CLUSTER_NAMES.items():
        text = re.sub(rf"\b{cluster}\b", embedded, text)
    return text


def assert_same_declarations(embedded, cluster, embedded_only=frozenset(), cluster_only=frozenset()):
    python = declarations(SOURCE / "_chronik.pyi")
    python.update(declarations(SOURCE / "_cluster.py"))
    ours = {k: normalized(v) for k, v in python[embedded].items() if k not in embedded_only}
    theirs = {k: normalized(v) for k, v in python[cluster].items() if k not in cluster_only}
    assert ours == theirs


PAIRS = [
    ("Producer", lambda: (chronik.Producer, chronik.ClusterProducer)),
    ("PendingSend", lambda: (_chronik.PendingSend, _cluster.ClusterPendingSend)),
    ("Consumer", lambda: (chronik.Consumer, cluster_consumer())),
]


@pytest.mark.parametrize("name,classes", PAIRS, ids=[name for name, _ in PAIRS])
def test_the_pairs_have_the_same_calls(name, classes):
    embedded, cluster = classes()
    assert_same_calls(embedded, cluster)
    assert_same_declarations(name, CLUSTER_NAMES[name])


def test_chronik_and_cluster_differ_only_by_the_documented_lists():
    only = dict(embedded_only=_cluster.EMBEDDED_ONLY, cluster_only=_cluster.CLUSTER_ONLY)
    assert_same_calls(chronik.Chronik, chronik.Cluster, **only)
    assert_same_declarations("Chronik", "Cluster", **only)


def test_the_lists_are_documented():
    section = API_DOC.read_text().split("## Embedded and cluster", 1)[1].split("\n## ", 1)[0]
    for name in _cluster.EMBEDDED_ONLY | _cluster.CLUSTER_ONLY:
        assert f"`{name}`" in section, f"docs/api.md's Embedded and cluster does not name {name}"


def test_the_check_sees_a_missing_call():
    """The comparison itself: a cluster producer without `flush` is told apart."""

    stripped = {k: v for k, v in vars(chronik.ClusterProducer).items() if k != "flush"}
    Without = type("ClusterProducer", (), stripped)
    with pytest.raises(AssertionError, match="only on Producer: \\['flush'\\]"):
        assert_same_calls(chronik.Producer, Without)


def test_the_calls_added_to_embedded_answer(tmp_path):
    with chronik.open(str(tmp_path / "data")) as db:
        db.create_topic("t", partitions=2)
        db.producer("t").send_batch([(b"k", b"v", [(b"h", b"x")], 5), (None, b"w")], partition=1)
        assert db.partition_count("t") == 2
        first, second = db.records("t", 1)
        assert first == (0, 5, b"k", b"v", [(b"h", b"x")])
        assert second[0] == 1 and second[2:] == (None, b"w", [])
        assert db.records("t", 0) == []
        with pytest.raises(chronik.NotFoundError):
            db.partition_count("missing")
