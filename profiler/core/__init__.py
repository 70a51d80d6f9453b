"""The recording core: Session and its hooks, the Recording (store + sampler + close), metric sources, the
sampler, devices and the run store. Everything a run's figures are measured by lives here."""
