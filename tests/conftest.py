import os

# A developer's own tuning never changes what a test sees; tests that need a user tier set their own directory.
os.environ["OASR_TUNE_USER_DB"] = "off"
