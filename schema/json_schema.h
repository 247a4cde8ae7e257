/* JSON Schema compiled to a GBNF grammar (the text kiri_grammar_check and the engine accept), so a
 * constrained sequence always produces JSON that validates against the schema.
 *
 * Honoured: type (one or a list), enum, const, properties (in schema order, optional ones
 * omittable) / required / additionalProperties (false, true or a schema; absent with properties
 * listed: no extra keys are generated), items / prefixItems (and draft-4 tuple items with
 * additionalItems) / minItems / maxItems, nested objects, anyOf, oneOf (only where every pair of
 * alternatives is provably exclusive as generated: by type, by const / enum values, or by a
 * required key the other forbids), allOf (members merged), $ref / $defs / definitions (local
 * "#/..." JSON pointers with ~0 ~1 and %-escapes; recursion allowed), string minLength /
 * maxLength, format (date, time, date-time, uuid, email, hostname, uri, ipv4), pattern (the
 * ECMA-262 subset schema_regex.h lists; unanchored unless ^ / $), integer minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum (draft 4's boolean forms too), multipleOf 1, and
 * minProperties / maxProperties / uniqueItems where the rest already implies them. Annotations
 * (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly,
 * writeOnly, ...) and unknown keywords are ignored, as validators ignore them. Of duplicate keys
 * in the JSON text the last wins, as everywhere kiri reads JSON.
 *
 * Where the schema leaves a choice, the grammar may take a narrower one that still validates:
 * bounded whitespace and digits, extra keys of [a-zA-Z0-9_-], integers for a bounded "number",
 * formats in a plain form, counts above 256 cut to 256.
 *
 * Refused, never silently relaxed (KIRI_E_UNSUPPORTED, field "#" + the JSON pointer of the
 * subschema, the keyword named in the message): not, if/then/else, patternProperties,
 * propertyNames, dependencies, contains, unevaluated*, multipleOf other than 1, number bounds
 * with no integer inside, other formats, backreferences / lookaround / \b in patterns,
 * combinations the compiler cannot intersect (pattern with minLength, enum with other
 * constraints, allOf members that disagree), oneOf it cannot prove exclusive, and a schema no
 * value satisfies (false, an empty enum, a $ref cycle with no finite value).
 *
 * Bounded: nesting depth (128), rule count (4096), enum size (1024), properties (512), steps,
 * input and output size (KIRI_GRAMMAR_MAX_SIZE). */
#ifndef KIRI_JSON_SCHEMA_H
#define KIRI_JSON_SCHEMA_H

#include <stddef.h>

struct kiri_status_info;

/* Compiles schema[0..len) (JSON text) into GBNF text whose top rule is root_name (NULL: "root")
 * and whose every other rule name starts with prefix (NULL: ""), so several schemas can be joined
 * in one grammar (tool calls do). *gbnf is NUL-terminated, owned by the caller (kiri_mem_free),
 * *gbnf_len its length. Errors: KIRI_E_INVALID_ARG for text that is not JSON, or larger than
 * KIRI_GRAMMAR_MAX_SIZE, or bad names (field "json_schema"), and for a keyword of the wrong type
 * (field: "#" + the JSON pointer); KIRI_E_UNSUPPORTED for a keyword or value outside what is
 * honoured (field: "#" + the JSON pointer); KIRI_E_NOMEM. */
int kiri_json_schema_to_gbnf(const char *schema, size_t len, const char *root_name, const char *prefix,
                             char **gbnf, size_t *gbnf_len, struct kiri_status_info *info);

#endif
