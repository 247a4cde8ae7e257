/* Grammar-constrained decoding: llama.cpp's GBNF compiled to a byte-level pushdown matcher, and
 * the token masks it gives over a vocabulary (include/kiri.h describes the format for users).
 *
 * Compilation. The text is parsed into rules whose alternatives are sequences of elements: a
 * reference to a rule, or one byte out of a set. Everything works on bytes: a literal becomes its
 * UTF-8 bytes, a character class (and `.`) becomes a generated rule whose alternatives are UTF-8
 * byte-range sequences (ASCII in one byte set), so byte-fallback tokens and tokens that end in the
 * middle of a character need nothing special. Groups and repetitions become generated rules
 * (x* as R ::= x R | empty, x{m,n} as m copies and n-m nested optionals). The compiler refuses
 * undefined rules, a missing root, rules defined twice, left recursion (a rule reaching itself
 * through elements that may be empty), a root that matches no finite text, and sizes past the
 * KIRI_GRAMMAR_MAX_* bounds; alternatives that can never complete are dropped. A compiled grammar
 * is immutable and may be shared by threads.
 *
 * Matching. A state is a set of stacks, each a path of positions (the element to match on top,
 * return positions below). Stacks are nodes interned in a per-state arena, so equal stacks are
 * the same node and the set deduplicates by node id; the top of every stack in a set is a byte
 * element (references are expanded as soon as they are reached; a reference in tail position
 * pushes no return, so x* runs in constant depth). The empty stack (the sentence may end) is a
 * flag beside the set. Feeding a byte moves every stack whose top accepts it. A reference reached
 * again over the same return within one byte's step is not expanded again, so ambiguity whose
 * paths converge (x ::= y | y, ("a" | "a")*) costs one path.
 *
 * Bounds. Ambiguity whose paths stay apart (stacks that differ in what they must match later) can
 * still grow with every byte; user grammars reach the server, so every step is bounded: a set past
 * KIRI_GRAMMAR_MAX_STACKS stacks, a stack past KIRI_GRAMMAR_MAX_DEPTH, a byte past
 * KIRI_GRAMMAR_MAX_BYTE_WORK steps of work or a mask past KIRI_GRAMMAR_MASK_WORK (plus
 * KIRI_GRAMMAR_MASK_WORK_PER_NODE per trie node) is KIRI_E_UNSUPPORTED, with
 * kiri_grammar_state_error naming the bound ("grammar too ambiguous: more than 4096 parse
 * stacks"). A start state past them is refused at compile time. The grammars of the tests and
 * those compiled from JSON Schemas and tools peak at 28 stacks and 79k steps for a mask of a 262k
 * vocabulary. A rejected or refused byte leaves the state as it was.
 *
 * Masks. A vocabulary trie (kiri_grammar_vocab: every token's bytes except control tokens, built
 * once) is walked depth-first from the state, one level of stacks per byte, pruning subtrees
 * where no stack survives. The walk numbers the distinct stack sets it meets and memoizes their
 * transitions by byte, so a subtree under a set seen before costs a table read per node (inside a
 * JSON string nearly every byte leads back to the same set); past MEMO_MAX sets it falls back to
 * advancing stacks directly, discarding the nodes made below a level when it leaves it. End-
 * of-generation tokens are allowed exactly where the sentence may end. A mask cache
 * (kiri_grammar_cache, LRU within a byte budget) keys masks on the grammar's fingerprint and the
 * state's exact content, so a state seen before (inside a JSON string, say) costs one lookup.
 * States, vocabularies and caches are used by one thread at a time.
 */
#ifndef KIRI_GRAMMAR_H
#define KIRI_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;
struct kiri_tokenizer;
struct kiri_grammar;
struct kiri_grammar_state;
struct kiri_grammar_vocab;
struct kiri_grammar_cache;

#define KIRI_GRAMMAR_MAX_RULES 16384      /* rules, generated ones included */
#define KIRI_GRAMMAR_MAX_ELEMS (1 << 20)  /* compiled elements */
#define KIRI_GRAMMAR_MAX_REPEAT 10000     /* m and n in x{m,n} */
#define KIRI_GRAMMAR_MAX_NEST 256         /* nested groups and classes in the text */
#define KIRI_GRAMMAR_MAX_STACKS 4096      /* stacks in one state */
#define KIRI_GRAMMAR_MAX_DEPTH 2048       /* positions on one stack */
/* Work, in steps (a stack moved over a byte, an element visited while expanding references): */
#define KIRI_GRAMMAR_MAX_BYTE_WORK (1 << 16)       /* for one byte fed */
#define KIRI_GRAMMAR_MASK_WORK (1 << 20)           /* for one mask, plus... */
#define KIRI_GRAMMAR_MASK_WORK_PER_NODE 4          /* ...this per node of the vocabulary trie */

/* Compiles text[0..len). On failure KIRI_E_INVALID_ARG (or KIRI_E_NOMEM) with info->field
 * "grammar" and a message "line L, column C: reason". *out is owned by the caller. */
int kiri_grammar_compile(const char *text, size_t len, struct kiri_grammar **out, struct kiri_status_info *info);
void kiri_grammar_free(struct kiri_grammar *g);

/* A state at the start of the grammar's root. The state borrows g, which must outlive it. */
int kiri_grammar_state_init(const struct kiri_grammar *g, struct kiri_grammar_state **out);
void kiri_grammar_state_free(struct kiri_grammar_state *st);
/* Back to the start of the root. */
void kiri_grammar_state_reset(struct kiri_grammar_state *st);
/* Consumes bytes. KIRI_OK; KIRI_E_INVALID_ARG when the grammar rejects them (the state is then
 * unchanged); KIRI_E_UNSUPPORTED past the stack bounds; KIRI_E_NOMEM. */
int kiri_grammar_state_feed(struct kiri_grammar_state *st, const void *bytes, size_t n);
/* May the sentence end here? */
int kiri_grammar_state_can_end(const struct kiri_grammar_state *st);
/* Is nothing more possible (the sentence is complete and cannot go on)? */
int kiri_grammar_state_done(const struct kiri_grammar_state *st);
/* After KIRI_E_UNSUPPORTED from a call on st: the bound the grammar passed, as a sentence
 * ("grammar too ambiguous: more than 4096 parse stacks"). Valid until the next call on st. */
const char *kiri_grammar_state_error(const struct kiri_grammar_state *st);

struct kiri_grammar_stats {
    uint32_t n_stacks;      /* stacks in the state now */
    uint32_t peak_stacks;   /* the most one set of stacks has held since the last reset, mask walks included */
    uint64_t steps;         /* the work of the last feed, mask or allows call (0: a mask from the cache) */
};
void kiri_grammar_state_stats(const struct kiri_grammar_state *st, struct kiri_grammar_stats *out);

/* The trie of t's tokens (owned by the caller). */
int kiri_grammar_vocab_init(const struct kiri_tokenizer *t, struct kiri_grammar_vocab **out);
void kiri_grammar_vocab_free(struct kiri_grammar_vocab *v);
int32_t kiri_grammar_vocab_n_vocab(const struct kiri_grammar_vocab *v);

/* A mask cache holding at most budget bytes of masks (0: no caching). */
int kiri_grammar_cache_init(size_t budget, struct kiri_grammar_cache **out);
void kiri_grammar_cache_free(struct kiri_grammar_cache *c);
/* Masks computed and found since init. */
void kiri_grammar_cache_counts(const struct kiri_grammar_cache *c, uint64_t *computed, uint64_t *hits);

/* Sets *mask to the allowed tokens in the state's next step: bit (id % 32) of word id / 32 for
 * id < n_vocab. Borrowed from the cache (or the state when cache is NULL) until the next call on
 * either. *n_allowed (may be NULL) counts the allowed tokens. KIRI_OK, KIRI_E_UNSUPPORTED past the
 * stack bounds, KIRI_E_NOMEM. */
int kiri_grammar_state_mask(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v,
                            struct kiri_grammar_cache *cache, const uint32_t **mask, int32_t *n_allowed);
/* Would token id be allowed (the same answer as its mask bit, without a mask)? 1, 0, or a
 * negative status. */
int kiri_grammar_state_allows(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v, int32_t id);
/* The bytes the vocabulary holds for id (NULL with *len 0 for control and end tokens). */
const uint8_t *kiri_grammar_vocab_piece(const struct kiri_grammar_vocab *v, int32_t id, size_t *len);

#endif
