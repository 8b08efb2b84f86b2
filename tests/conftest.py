import os

from hypothesis import HealthCheck, settings

# Compiling with TVM takes tens of milliseconds, so the default 200 ms deadline is meaningless here.
settings.register_profile(
    "dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
# CI is deterministic: a red run must be reproducible from its log.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=50,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))
