"""Root pytest configuration: what every test module needs before anything is imported."""

import os

# Same as the Makefile: silence jsii's Node 20 deprecation/end-of-life banners (pytest run directly too).
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Tests never reach AWS: no credential probing of the instance metadata service.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
