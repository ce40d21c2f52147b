"""Tuning: receipts (receipts), reading a frozen table (tables, below the engine), making one
(freeze), campaigns (campaign) measured on the GPU (measure), benchmarks (bench),
kernel-check (kernelcheck), pandas analysis (research). Imports nothing: the engine imports
tables and receipts, and the harness modules import the engine."""
