"""A worker executes exactly the action list the planner produced, its
transport groups included: the coordinator's plan (Plan with its
structured action lists) says how many groups and sends/receives each rank
posts per iteration, and every rank's Report of every iteration says how
many it posted; they are equal for every family. A worker whose receive
limit is below a job's assignment is named when the job is refused."""

import grpc

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, job_spec, rpc_error
from zbsvc import zb_pb2

P, ITERATIONS = 4, 3
COMM = {zb_pb2.ACTION_KIND_SEND_F, zb_pb2.ACTION_KIND_RECV_F, zb_pb2.ACTION_KIND_SEND_B,
        zb_pb2.ACTION_KIND_RECV_B}


def planned_groups(action_list):
    """(groups, comm actions, largest group) of one rank's ActionList."""
    groups = actions = largest = size = 0
    for kind, grouped in zip(action_list.kind, action_list.group_with_next):
        if kind not in COMM:
            size = 0
            continue
        actions += 1
        if size == 0:
            groups += 1
        size += 1
        largest = max(largest, size)
        if not grouped:
            size = 0
    return groups, actions, largest


def check_family(c, schedule, m, chunks=0):
    spec = job_spec(name="groups-" + schedule, ranks=P, microbatches=m, schedule=schedule, chunks=chunks,
                    t=0.001, iterations=ITERATIONS, bytes_per_activation=1024)
    plan = c.stub.Plan(zb_pb2.PlanRequest(spec=spec, with_action_lists=True), timeout=60)
    assert len(plan.action_lists) == P, plan
    want = [planned_groups(al) for al in plan.action_lists]
    jid = c.submit(spec)
    c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
    its = iteration_events(c.events(jid))
    assert len(its) == ITERATIONS, its
    for it in its:
        got = {r.rank: (r.comm_groups, r.comm_actions) for r in it.ranks}
        for rank in range(P):
            assert got[rank] == want[rank][:2], "%s rank %d iteration %d: executed %s, planned %s" % (
                schedule, rank, it.iteration, got[rank], want[rank][:2])
    print("%-16s groups per rank %s, sends+receives %s, largest group %d" %
          (schedule, [w[0] for w in want], [w[1] for w in want], max(w[2] for w in want)))
    return max(w[2] for w in want)


def test_workers_post_the_planned_groups():
    with Cluster(workers=P, name="groups") as c:
        largest = {}
        for schedule, m, chunks in (("gpipe", 8, 0), ("1f1b", 8, 0), ("interleaved-1f1b", 8, 2), ("zb-h1", 8, 0),
                                    ("zb-h2", 8, 0), ("zb-auto", 8, 0), ("zb-v", 8, 0), ("v-half", 8, 0),
                                    ("v-min", 8, 0)):
            largest[schedule] = check_family(c, schedule, m, chunks)
        # the groups reached the workers: some ranks post sends and receives together
        assert max(largest.values()) >= 2, largest


def test_worker_receive_limit_is_named():
    with Cluster(workers=0, name="limits") as c:
        for k in range(P - 1):
            c.start_worker("w%d" % k)
        c.start_worker("small", extra=["--max-message-bytes", "4096"])
        c.wait_workers(P)
        small = [w for w in c.list_workers() if w.id == "small"]
        assert small, c.list_workers()
        code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(
            spec=job_spec(name="big", ranks=P, microbatches=400, iterations=1)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "4096" in details and "small" in details and "--max-message-bytes" in details, details
        print("refused:", details)
        # a job that fits runs on every worker, the small one included
        jid = c.submit(job_spec(name="fits", ranks=P, microbatches=4, iterations=1))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
