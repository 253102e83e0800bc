"""Capacity and pricing commands: quota, Capacity Block offerings and purchase, reservations, prices across
regions, and cost estimates."""
