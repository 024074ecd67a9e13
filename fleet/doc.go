// Package fleet places the shards of a store on the engines of a fleet, and moves
// them between engines without losing or replaying records.
//
// A server embeds it: it opens its engine, calls Join with its weight and its
// catalog of shards, serves the shards its Membership has open, and calls Leave
// before closing the engine (see the example). Everything goes through objects
// on the engines' authority:
//
//   - Members are the engines whose instance lease (the one every shard they own
//     is owned under) lives and names the fleet in its attributes, with the
//     member's weight and the shards it has open. Joining, leaving and dying are
//     changes of that lease: no other object, and no write while nothing changes.
//   - One member is the leader, by the lease fleet/<name>/leader. At most once per
//     PublishEvery it plans (Plan: weight-balanced and sticky) from the members,
//     the catalog, the owners and the assignment published, and publishes the new
//     assignment as the one object fleet/<name>/assignment, by compare-and-swap.
//   - Every member reads the assignment each PollEvery. It opens the shards
//     assigned to it (again every RetryEvery while their previous owner still
//     hands them over) and hands over those assigned elsewhere: Shard.Drain, a
//     cooperative close (stop intake, seal everything, publish, release) that,
//     past DrainDeadline, is forced (the shard is retired, and its next owner
//     reads the unsealed records from the tail). A cooperative handoff leaves the
//     next owner nothing to replay.
package fleet
