"""``tirpat tune --trials N`` measures N candidates in all and says N (the backend's own
schedule, measured first, is one of them: it used to be one more, "5 trials" for 4)."""

import re


def test_the_trials_reported_are_the_trials_asked_for(tirpat, example_mlp, tmp_path):
    trials = 3
    result = tirpat("tune", example_mlp, "-t", "accel, llvm", "--trials", str(trials), "--batch", "2",
                    "--strategy", "replay-trace", "--records", "records", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^{trials} trials in [\d.]+ s; records in records$", result.stdout, re.M), result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] == ["accel"]]
    assert rows and sum(int(row[2]) for row in rows) == trials, result.stdout


def test_fewer_trials_than_partitions_measure_each_partitions_own_schedule_and_say_so(tirpat, example_mlp, tmp_path):
    result = tirpat("tune", example_mlp, "-t", "accel, llvm", "--trials", "1", "--strategy", "replay-trace",
                    "--records", "records", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tirpat tune: warning: 1 trial(s) asked for 2 tasks: tuning 2, one per task" in result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] == ["accel"]]
    assert [(row[2], row[4] != "-") for row in rows] == [("1", True), ("1", True)], result.stdout
    assert re.search(r"^2 trials in [\d.]+ s \(1 asked; raised to one per task", result.stdout, re.M), result.stdout
