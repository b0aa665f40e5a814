"""Clusters: ``start_cluster``, batch-system jobs and worker set-up."""
