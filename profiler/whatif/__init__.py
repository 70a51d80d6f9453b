"""What-if: predictions from a measured run (other devices, workers, batch sizes) and their check runs."""
