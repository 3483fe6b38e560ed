"""One tree of Kubernetes API errors for both clients: the operator's and the planner's raise the same
classes, an answer's status picks the subclass, and an error without an answer reads as its message."""

from dynamo_api.kube_errors import Conflict, Invalid, KubeError, NotFound, kube_error
from dynamo_operator.reconcile import kube as operator_kube
from dynamo_worker.planner import kube as planner_kube
from dynamo_worker.planner.localgraph import GraphFileError


def test_both_clients_raise_one_tree():
    assert operator_kube.KubeError is planner_kube.KubeError is KubeError
    assert (operator_kube.NotFound, operator_kube.Conflict) == (NotFound, Conflict)
    assert issubclass(GraphFileError, KubeError)


def test_an_answers_status_picks_the_subclass():
    assert [type(kube_error(s, "R", "m")) for s in (404, 409, 422, 403, 500)] == [
        NotFound,
        Conflict,
        Invalid,
        KubeError,
        KubeError,
    ]
    err = kube_error(409, "Conflict", "the object has been modified")
    assert (err.status, err.reason, err.message) == (409, "Conflict", "the object has been modified")
    assert str(err) == "409 Conflict: the object has been modified"


def test_an_error_without_an_answer_reads_as_its_message():
    err = GraphFileError("--graph-file g.yaml is not valid YAML; fix the file")
    assert err.status == 0 and str(err) == "--graph-file g.yaml is not valid YAML; fix the file"
