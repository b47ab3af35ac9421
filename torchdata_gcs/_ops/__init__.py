"""What one request does: ``gs://`` URLs and names, object metadata and checksums, list pages (size
limit, fields, trail), single-object verbs (read, create, compose, delete, describe) and the client that
runs them, temporary objects (names, versions, deletion), batch deletes, part uploads, and the listing and
aborting of multipart uploads."""
