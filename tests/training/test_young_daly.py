"""training/young_daly.py: the local checkpoint interval that maximizes goodput, sqrt(2 x MTBF x save stall),
from Llama 3's interruption rate and the save stall measured on an H100."""

import math

import pytest

from training import young_daly as yd


def test_the_rate_is_llama_3s_per_node_and_the_job_fails_as_often_as_its_nodes():
    assert yd.NODE_MTBF_H == pytest.approx(6336, rel=1e-3)  # 54 days x 2,048 nodes / 419
    assert yd.job_mtbf_s(16) == pytest.approx(6336 * 3600 / 16, rel=1e-3)
    assert yd.job_mtbf_s(256) * 16 == pytest.approx(yd.job_mtbf_s(16))


def test_the_stall_is_the_measured_one_scaled_by_each_gpus_shard():
    one_gpu_1b = round(yd.MEASURED_STATE_BYTES / yd.STATE_BYTES_PER_PARAM)
    assert yd.save_stall_s(one_gpu_1b, 1) == pytest.approx(15.4)
    assert yd.save_stall_s(one_gpu_1b * 8, 64) == pytest.approx(15.4 / 8)


def test_the_interval_is_young_daly_and_far_means_more_than_three_times_off():
    assert yd.optimal_interval_s(16, 5.0) == pytest.approx(math.sqrt(2 * yd.job_mtbf_s(16) * 5.0))
    steps = yd.optimal_interval_steps(16, 5.0, step_s=10.0)
    assert steps == round(yd.optimal_interval_s(16, 5.0) / 10.0)
    assert not yd.is_far(steps * 3, steps) and yd.is_far(steps * 3 + 1, steps)
    assert not yd.is_far(math.ceil(steps / 3), steps) and yd.is_far(steps // 4, steps)
    line = yd.interval_line(16, 70_000_000_000, 128, 53.1)
    optimal = yd.optimal_interval_steps(16, yd.save_stall_s(70_000_000_000, 128), 53.1)
    assert line.endswith(f"--set checkpoint.local_interval_steps={optimal}")


def test_the_trainer_says_once_after_its_second_step_when_its_interval_is_far_from_the_optimum():
    params, gpus, nodes, step_s = 8_000_000_000, 128, 16, 2.5
    optimal = yd.optimal_interval_steps(nodes, yd.save_stall_s(params, gpus), step_s)

    def said(interval: int, start_step: int = 0) -> list[str]:
        check = yd.IntervalCheck(interval, nodes=nodes, params=params, gpus=gpus, start_step=start_step)
        now, lines = 100.0, []
        for done in range(start_step + 1, start_step + 6):
            now += 60.0 if done == start_step + 1 else step_s  # the first step compiles: not the step time
            if (line := check.step_done(done, now)) is not None:
                lines.append((done, line))
        return lines

    (far_above,) = said(optimal * 3 + 1, start_step=40)
    assert far_above[0] == 42  # the resumed start's second step
    assert far_above[1].startswith(f"checkpoint.local_interval_steps={optimal * 3 + 1} is more than 3x Young/Daly's "
                                   f"optimum for this run, every {optimal:,} steps")
    assert f"MTBF {yd.job_mtbf_s(nodes) / 3600:,.1f} h at 16 nodes" in far_above[1]
    assert far_above[1].endswith(f"step 2.5 s measured); --set checkpoint.local_interval_steps={optimal}")
    ((_, far_below),) = said(optimal // 4)
    assert f"is under 1/3 of Young/Daly's optimum for this run, every {optimal:,} steps" in far_below
    assert said(optimal) == [] and said(optimal * 3) == []  # near enough: nothing said
    assert said(0) == []  # no local tier
