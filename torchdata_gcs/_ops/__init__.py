"""What one request does: ``gs://`` URLs and names, object metadata and checksums, single-object
verbs (read, create, delete, describe), and the listing and aborting of multipart uploads."""
