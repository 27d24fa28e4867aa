"""Tools around the pipeline, outside its core: auditing what runs left in Redis, faults."""
