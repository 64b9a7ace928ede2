from tokenmix.checks.tolerances import *  # noqa: F401,F403  (the one tolerance table, for tests that import `tolerances`)
