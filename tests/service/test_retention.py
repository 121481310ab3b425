"""Job retention and ListJobs pages (issue 13, Bounds): finished jobs past
retain_finished_jobs or retain_finished_s leave the coordinator and the
store with their events, counted by zb_jobs_pruned_total; ids never repeat,
even once every job that used them is gone; ListJobs pages through the
jobs oldest first."""

import os
import sqlite3

import zbsvc
from zbsvc import STATE, Cluster, job_spec, parse_metrics, rpc_error, series, zb_pb2

import grpc


def run_jobs(c, n):
    ids = []
    for k in range(n):
        jid = c.submit(job_spec(name="r%d" % k, ranks=2, microbatches=2, t=0.0001, iterations=1))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        ids.append(jid)
    return ids


def stored(c):
    """(job ids, event counts by job) in the coordinator's SQLite file."""
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(c.data_dir, "zb.db"), uri=True)
    try:
        jobs = [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY created_ms")]
        events = dict(db.execute("SELECT job_id, count(*) FROM events GROUP BY job_id"))
        return jobs, events
    finally:
        db.close()


def pruned_total(c):
    return list(series(parse_metrics(c.metrics()[2]), "zb_jobs_pruned_total").values())[0]


def test_finished_jobs_past_the_count_are_pruned_with_their_events():
    with Cluster(workers=2, name="retain-count", coordinator_args=["--retain-finished-jobs", "3"]) as c:
        ids = run_jobs(c, 8)
        zbsvc.wait_until("pruning to 3 jobs", lambda: len(c.list_jobs()) == 3, 10)
        listed = [j.id for j in c.list_jobs()]
        jobs, events = stored(c)
        print("ran %s; listed %s; stored %s with events %s; pruned %d" %
              (ids, listed, jobs, events, pruned_total(c)))
        assert listed == ids[-3:] and jobs == ids[-3:], (listed, jobs)
        assert set(events) == set(ids[-3:]), events  # the pruned jobs' events went with them
        assert pruned_total(c) == 5
        code, details = rpc_error(c.stub.GetJob, zb_pb2.GetJobRequest(job_id=ids[0]))
        assert code == grpc.StatusCode.NOT_FOUND, (code, details)
        c.assert_serving()


def test_ids_never_repeat_after_every_job_is_pruned():
    """Jobs older than retain_finished_s go; after a restart with none
    left in the store, the next id still follows the last one used."""
    with Cluster(workers=2, name="retain-age", coordinator_args=["--retain-finished-s", "1"]) as c:
        ids = run_jobs(c, 3)
        zbsvc.wait_until("every job pruned", lambda: stored(c)[0] == [] and c.list_jobs() == [], 15)
        assert pruned_total(c) == 3
        c.coordinator.stop()
        c.start_coordinator(port=c.port)  # the workers re-attach there
        c.wait_workers(2)
        after = run_jobs(c, 1)
        print("before the restart %s, all pruned; after it %s" % (ids, after))
        assert int(after[0][2:]) == int(ids[-1][2:]) + 1, (ids, after)


def test_list_jobs_pages():
    with Cluster(workers=2, name="retain-pages") as c:
        ids = run_jobs(c, 7)
        pages, token = [], ""
        while True:
            r = c.stub.ListJobs(zb_pb2.ListJobsRequest(page_size=2, page_token=token), timeout=10)
            pages.append([j.id for j in r.jobs])
            token = r.next_page_token
            if not token:
                break
        print("pages of 2: %s" % pages)
        assert pages == [ids[0:2], ids[2:4], ids[4:6], ids[6:7]], pages
        assert [j.id for j in c.list_jobs()] == ids  # the default page holds them all
        for req, text in [(zb_pb2.ListJobsRequest(page_token="bogus"), "page_token"),
                          (zb_pb2.ListJobsRequest(page_size=-1), "page_size")]:
            code, details = rpc_error(c.stub.ListJobs, req)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details, (code, details)
        listed = c.zbctl("list")
        assert listed.returncode == 0 and all(i in listed.stdout for i in ids), listed.stdout
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
