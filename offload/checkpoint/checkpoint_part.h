// One server's part of a checkpoint: the fp32 master, m and v of the chunks
// it owns (and, when the job runs a delayed parameter update, the 16-bit
// weights of the version before: what its next step computes on), in one file, written once and
// read back by any number of servers (a checkpoint restores onto a different server count). The
// format is described in offload/checkpoint/design.md.
//
//   ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(dir + "/part-00000.zop"));
//   for (chunk : my chunks) ZO_RETURN_IF_ERROR(writer->AddChunk(c, begin, master, m, v));
//   ZO_ASSIGN_OR_RETURN(CheckpointPartSummary summary, writer->Finish());  // fsynced
//
// This header gathers the part's pieces, one concept a file:
//   checkpoint_part_types.h     CheckpointChunk, CheckpointPartSummary
//   checkpoint_part_writer.h    CheckpointPartWriter: chunk after chunk
//   scattered_part_writer.h     ScatteredPartWriter: ranges in any order, from any thread
//   checkpoint_part_reader.h    CheckpointPartReader: validated, checksummed reads
//   internal/part_format.h      the bytes all three share
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_

#include "offload/checkpoint/checkpoint_part_reader.h"
#include "offload/checkpoint/checkpoint_part_types.h"
#include "offload/checkpoint/checkpoint_part_writer.h"
#include "offload/checkpoint/scattered_part_writer.h"

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_
