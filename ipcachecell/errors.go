// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import "errors"

var (
	// ErrResourceInUse is returned (wrapped, naming the resource) by
	// [IPCache.NewHandle] for a resource that already has a live handle: a
	// resource has exactly one owner until its handle is released.
	ErrResourceInUse = errors.New("resource already has a handle")

	// ErrTooManyHandles is returned (wrapped, naming the resource) by
	// [IPCache.NewHandle] when every resource id is held by a live handle
	// (2^35 of them: far more than memory holds). A row's key holds its
	// resource's id in a bounded number of bytes.
	ErrTooManyHandles = errors.New("too many live handles")

	// ErrHandleReleased is returned (wrapped, naming the resource) by a
	// [Handle]'s Upsert, UpsertBatch, Remove, RemoveBatch, Release and
	// ReleaseGradually once the handle is released.
	ErrHandleReleased = errors.New("handle released")

	// ErrInvalidMetadata is returned (wrapped, with the cause) by
	// [IPCache.NewHandle] for an empty resource name, and by a [Handle]'s
	// Upsert, UpsertBatch, Remove and RemoveBatch for a prefix that is not
	// valid or has a zone, or a requested identity that is not a local
	// one. The batch then writes nothing.
	ErrInvalidMetadata = errors.New("invalid ipcache metadata")

	// ErrRowNotDecodable is returned by the JSON and YAML decoding of a
	// [PrefixMetadata] row: a row belongs to its resource's handle, and
	// only handles write rows. statedb's db/insert of a metadata row fails
	// with it, rather than inserting a row that has no owner.
	ErrRowNotDecodable = errors.New("ipcache metadata rows are written by handles only, not decoded")
)
