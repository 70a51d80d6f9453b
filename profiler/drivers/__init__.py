"""Training drivers: the loop ``stallscope run`` trains a scenario with (runner) and one rank's DDP (ddp)."""
