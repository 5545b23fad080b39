"""The first-use bench's load timeline (tools/bench/rounds.py timeline_pipelines): the GPU pipelines the counters saw
made, put into the load's steps by their stamps (the page's own timeline is checked in a browser by
tests/test_site.py and tests/test_first_use.py)."""

from webbuild.tools.bench.rounds import timeline_pipelines


def test_each_pipeline_goes_to_the_step_it_was_made_in():
    info = {"loadOrigin": 1000.0, "loadTimeline": [
        {"step": "encoder session", "start_ms": 10, "end_ms": 20},
        {"step": "encoder warm-up", "start_ms": 20, "end_ms": 50}]}
    created = [{"name": "a", "at": 1015.0}, {"name": "b", "at": 1030.0}, {"name": "c", "at": 1049.0},
               {"name": "late", "at": 1200.0}]
    steps = timeline_pipelines(info, created)
    assert [(s["step"], s["pipelines"], s["made"]) for s in steps] == [
        ("encoder session", 1, ["a"]), ("encoder warm-up", 2, ["b", "c"])]


def test_a_page_runtime_without_a_timeline_gives_none():
    assert timeline_pipelines({"load": {}}, [{"name": "a", "at": 1.0}]) is None


def test_each_step_gets_the_gpu_clock_of_its_own_wall_time():
    # the worker's clock starts at 5,000,000 ms since the epoch, the load at its 1000 ms: a step at 10-20 ms of the
    # load runs from 5001.010 to 5001.020 s of wall time
    info = {"loadOrigin": 1000.0, "loadTimeline": [{"step": "encoder session", "start_ms": 10, "end_ms": 20}]}
    windows = []
    steps = timeline_pipelines(info, [], lambda t0, t1: windows.append((t0, t1)) or {"sm_mhz": t0}, 5_000_000.0)
    assert windows == [(5001.010, 5001.020)] and steps[0]["clock"] == {"sm_mhz": 5001.010}
    assert "clock" not in timeline_pipelines(info, [])[0]  # no sampler: no clock
