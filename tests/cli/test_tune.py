"""``tirpat tune --trials N`` measures N candidates in all and says N (the backend's own
schedule, measured first, is one of them: it used to be one more, "5 trials" for 4)."""

import re


def test_the_trials_reported_are_the_trials_asked_for(tirpat, example_mlp, tmp_path):
    trials = 3
    result = tirpat("tune", example_mlp, "-t", "accel, llvm", "--trials", str(trials), "--batch", "2",
                    "--strategy", "replay-trace", "--records", "records", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # 3 trials: one search (4 at least) fits; the summary names it and the task left
    assert re.search(rf"^{trials} trials in [\d.]+ s \(searched 1 of 2 [^)]*\); records in records$", result.stdout,
                     re.M), result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] == ["accel"]]
    assert rows and sum(int(row[2]) for row in rows) == trials, result.stdout


def test_fewer_trials_than_partitions_search_the_largest_and_say_which(tirpat, example_mlp, tmp_path):
    """--trials 2 for 2 partitions: 2 trials measured (not raised to one per partition),
    both on the partition the backend estimates to gain most on (of equal gains, the one of
    most work); the summary names it and the one left."""
    result = tirpat("tune", example_mlp, "-t", "accel, llvm", "--trials", "2", "--strategy", "replay-trace",
                    "--records", "records", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] == ["accel"]]
    assert sorted(row[2] for row in rows) == ["0", "2"], result.stdout
    [searched] = [row[0] for row in rows if row[2] == "2"]
    [left] = [row[0] for row in rows if row[2] == "0"]
    assert re.search(rf"^2 trials in [\d.]+ s \(searched 1 of 2 tasks, the most to gain first: {re.escape(searched)}; "
                     rf"2 trials each: its backend's own schedule and its cheapest candidates by the backend's "
                     rf"estimate; the other 1 left at their backend's own schedule: {re.escape(left)}\); "
                     rf"records in records$", result.stdout, re.M), result.stdout
