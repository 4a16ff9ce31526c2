"""Ray's own interface to the store: the State API routes (`ray list tasks`, `ray summary
tasks`, `ray get tasks`, `ray.util.state`) and Ray's Chrome-trace timeline, answered
from the Parquet lake after the cluster is gone. docs/ray.md says how to use them."""
