"""Other libraries' APIs on camkit: scripts written for them run with one changed import.

Each subpackage reproduces one library's public API as a thin translation onto camkit's own
explainers, targets and metrics; none holds a second implementation of a method, and every place
where its result differs from the original's (because the original is wrong) is named in the
migration guide. Nothing else in camkit imports this wing.
"""
