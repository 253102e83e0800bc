"""`clusterctl plan` prints the local checkpoint interval that maximizes goodput for the run it plans
(training/young_daly.py), from its node count, each GPU's shard of the state and its step time."""

from training import young_daly as yd
from training.shapes import count_params


def test_plan_prints_the_young_daly_interval_for_its_nodes(cli):
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--nodes", "64", "--instance-types",
                 "p5.48xlarge")
    assert result.code == 0, result.err
    (line,) = [line for line in result.lines if line.startswith("local checkpoint interval for goodput")]
    (step,) = [line for line in result.lines if line.startswith("p5.48xlarge x 64: ")]
    step_s = float(step.split(", step ")[1].split(" s ")[0])
    replicas = int(step.split("HSDP ")[1].split("x")[0]) if ": HSDP " in step else 1
    from training.config import load_config

    params = count_params(load_config("llama3-70b").model)
    stall = yd.save_stall_s(params, 64 * 8 // replicas)
    assert f"at 64 nodes: MTBF {yd.job_mtbf_s(64) / 3600:,.1f} h" in line
    assert line.endswith(f"--set checkpoint.local_interval_steps={yd.optimal_interval_steps(64, stall, step_s)}")
