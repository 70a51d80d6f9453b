"""Multi-rank jobs: the elastic launcher, the job directory, the job's analysis, live view and rendering."""
