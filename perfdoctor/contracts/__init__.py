"""Typed contracts of the files perfdoctor writes and reads back (the run folder, report.json,
baselines): one msgspec Struct per file, shared by the writer and the reader, versioned by its
`schema` string. Anything read from disk is validated into these at the edge."""
