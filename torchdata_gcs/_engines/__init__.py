"""What many requests do together: parallel and shared listing, ordered downloads, composites, streaming
uploads (multipart and composite), compression, and streams over downloaded bytes."""
